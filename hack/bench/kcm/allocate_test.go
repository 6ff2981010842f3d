// Package kcmbench runs kube-controller-manager's cidrset (k8s.io/kubernetes
// pkg/controller/nodeipam/ipam/cidrset, through its exported API only) on the IPv4 sizes that
// its own BenchmarkAllocateAll_* lack, measured the same way: per iteration, allocate every
// block of the range plus one (which fails), then release the whole range.
// hack/bench/allocator.sh copies this file into a scratch copy of the hack/k8s module.
package kcmbench

import (
	"net"
	"testing"

	"k8s.io/kubernetes/pkg/controller/nodeipam/ipam/cidrset"
)

func allocateAll(b *testing.B, cidr string, mask int) {
	_, clusterCIDR, err := net.ParseCIDR(cidr)
	if err != nil {
		b.Fatal(err)
	}
	set, err := cidrset.NewCIDRSet(clusterCIDR, mask)
	if err != nil {
		b.Fatal(err)
	}
	prefix, _ := clusterCIDR.Mask.Size()
	blocks := 1 << (mask - prefix)
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		for i := 0; i <= blocks; i++ {
			_, _ = set.AllocateNext()
		}
		if err := set.Release(clusterCIDR); err != nil {
			b.Fatal(err)
		}
	}
}

// 10.0.0.0/16 in /24s: 256 blocks, like controller/benches/cidrset.rs allocate_all/16_24.
func BenchmarkAllocateAll_16_24(b *testing.B) { allocateAll(b, "10.0.0.0/16", 24) }

// 10.0.0.0/8 in /24s: 65,536 blocks, the range of hack/bench/burst.sh (bench/benches/allocator.rs).
func BenchmarkAllocateAll_8_24(b *testing.B) { allocateAll(b, "10.0.0.0/8", 24) }
