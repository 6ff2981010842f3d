// Stands in for Tencent Cloud's VPC SDK, which flannel's tencent-vpc backend imports and the Go
// module proxy does not serve (every version answers "not available"). The local cluster uses
// the vxlan and host-gw backends only; every call here fails, so tencent-vpc cannot be chosen
// by mistake. See ../go.mod's replace directive.
module github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc

go 1.26.0
