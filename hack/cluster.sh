#!/usr/bin/env bash
# A real local cluster on this machine: the control plane (etcd, kube-apiserver,
# kube-controller-manager without its node IPAM, kube-scheduler, a kube-proxy for the API
# server's own Service traffic) and N nodes, each a kubelet + containerd + kube-proxy in its own
# network namespace with its own IP, so that pods on the host network of two nodes never clash.
# Nodes stay NotReady until they have a podCIDR: their CNI config is written by containerd from
# the podCIDRs the kubelet passes on (bridge + host-local), and nodeipam is what hands them out.
#
#   build                install the Debian packages and build kubelet, kube-proxy,
#                        kube-scheduler, containerd, the pause image, flanneld (hack/flannel)
#                        and the netprobe image (hack/cluster/netprobe) (cached, stamped)
#   up [--nodes N] [--cni bridge|flannel] [--flannel-network CIDR] [--flannel-backend B]
#                        (after a `down` of any leftovers) start the control plane and N nodes
#                        (default 2); prints the KUBECONFIG export. --cni bridge (default):
#                        pods reach their own node only; --cni flannel: flanneld (kube subnet
#                        manager, --ip-masq) on every node with Network CIDR (default
#                        10.112.0.0/12, which must hold every podCIDR) and backend B (vxlan,
#                        the default, or host-gw); docs/integrations.md says why
#   deploy [--pod-network-supernet CIDR[,CIDR]]
#                        import the nodeipam image (hack/image.sh) and
#                        `kubectl apply -k hack/cluster/overlay` (= config/default + the image
#                        name and, with config/components/api-server, the API server's
#                        address); waits for the Deployment. --pod-network-supernet: the
#                        consumers' pod network, set as the controller's
#                        NODEIPAM_POD_NETWORK_SUPERNETS so that the webhook warns outside it
#                        (not needed for flannel's Network: `up --cni flannel` publishes it in
#                        ConfigMap kube-flannel/kube-flannel-cfg, which nodeipam reads)
#   add-node [--labels k=v,...]   start one more node; prints its name
#   remove-node NAME     stop a node's kubelet, pods, containerd and kube-proxy and remove its
#                        network namespace (the Node object stays: delete it with kubectl)
#   kubectl ARGS...      kubectl with the cluster's admin kubeconfig
#   down                 stop everything and leave nothing behind: processes, mounts,
#                        network namespaces, the bridge, cgroups, sysctls, files
#
# Addressing, all created here: the bridge nipam0 holds 10.251.0.1/24 on the host; the control
# plane's namespace is 10.251.0.2 (API server on :6443), node i's is 10.251.0.(10+i).
# Services: 10.96.0.0/16. Needs root.
set -Eeuo pipefail
source "$(dirname "$0")/lib.sh"
# A command that fails under `set -e` says which one, where, and in which subcommand.
CLUSTER_CMD="${1:-}"
trap 'log "error: step=$CLUSTER_CMD (hack/cluster.sh line $LINENO): \"$BASH_COMMAND\" exited $?"' ERR

CONTAINERD_VERSION="v2.2.9"
# Bump when the build steps below change: it is part of the node binaries' stamp.
NODE_BUILD_REV=1
NODE_BIN="$NODEIPAM_BIN_DIR/node-k8s-$K8S_VERSION-containerd-$CONTAINERD_VERSION"
CLUSTER_DIR="$NODEIPAM_CACHE/cluster"
PAUSE_IMAGE="localhost/pause:nodeipam"
PAUSE_ARCHIVE="$NODE_BIN/pause.oci.tar"
# What pods of the local cluster run to send and answer traffic (hack/cluster/netprobe).
NETPROBE_IMAGE="localhost/netprobe:nodeipam"
NETPROBE_DIR="$NODEIPAM_BIN_DIR/netprobe"
NETPROBE_ARCHIVE="$NETPROBE_DIR/netprobe.oci.tar"
# The pod network of `up --cni flannel`, built from hack/flannel (pinned there too).
FLANNEL_VERSION="v0.28.10"
FLANNEL_BIN="$NODEIPAM_BIN_DIR/flannel-$FLANNEL_VERSION"
NODEIPAM_IMAGE="${NODEIPAM_IMAGE:-$NODEIPAM_RELEASE_IMAGE_DEFAULT}"

BRIDGE=nipam0
SUBNET_PREFIX=10.251.0
HOST_IP=$SUBNET_PREFIX.1
CP_NS=nipam-cp
CP_IP=$SUBNET_PREFIX.2
API_PORT=6443
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SVC_IP=10.96.0.1
CNI_NETWORK=nodeipam-cluster
# Every cgroup made here (the kubelets' cgroupRoot and the daemons' tracking groups) starts
# with this, so `down` finds them all.
CGROUP_PREFIX=nipam
# What the kubelet and kube-proxy may change on the host; `up` saves them, `down` restores them.
SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
  net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
  net.netfilter.nf_conntrack_tcp_timeout_close_wait net.ipv4.conf.all.route_localnet)
# Host folders the kubelet, containerd and the CNI plugins write to whatever their
# configuration says (device-plugins socket, /var/log/containers links, shim sockets, CNI result
# cache). `up` records which exist and what is in them; `down` removes what was added.
HOST_PATHS=(/var/lib/kubelet /var/log/containers /var/log/pods /run/containerd /var/lib/cni
  /opt/containerd /run/nri /etc/cdi /var/run/cdi)
HOST_SAVED="$NODEIPAM_CACHE/cluster-host.saved"
APT_PACKAGES=(runc containernetworking-plugins iptables conntrack buildah iproute2 curl gcc libc6-dev openssl util-linux)

KUBECTL() { "$NODEIPAM_ASSETS/kubectl" --kubeconfig "$CLUSTER_DIR/admin.kubeconfig" "$@"; }

now_ms() { date +%s%3N; }
# wait_for STEP TIMEOUT_S CMD...: polls CMD every 0.25 s; dies naming STEP on timeout.
wait_for() {
  local step="$1" timeout="$2"; shift 2
  local deadline=$(( $(now_ms) + timeout * 1000 ))
  until "$@" >/dev/null 2>&1; do
    (( $(now_ms) < deadline )) || die "step=$step: not done within ${timeout}s (logs: $CLUSTER_DIR/logs)"
    sleep 0.25
  done
}

# ---------------------------------------------------------------------------------------------
# build

install_packages() {
  local missing=() p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    log "Debian packages present"
    return 0
  fi
  command -v apt-get >/dev/null || die "step=build: missing packages ${missing[*]} and no apt-get"
  timed "apt-get update" apt-get update -qq
  timed "apt-get install ${missing[*]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# static_image SRC BIN IMAGE ARCHIVE: compiles C file SRC static as /BIN into a one-file image
# IMAGE (entrypoint /BIN, an unprivileged user) saved as the OCI archive ARCHIVE.
static_image() {
  local src="$1" bin="$2" image="$3" archive="$4"
  local work
  work="$(dirname "$archive")/$bin-build"
  rm -rf "$work" && mkdir -p "$work"
  gcc -Os -static -o "$work/$bin" "$src" || die "step=build-$bin: gcc -static $src failed"
  strip "$work/$bin"
  local b=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
  local c
  c="$("${b[@]}" from scratch)"
  "${b[@]}" copy "$c" "$work/$bin" "/$bin" >/dev/null
  "${b[@]}" config --entrypoint "[\"/$bin\"]" --user 65535:65535 "$c"
  "${b[@]}" commit --quiet "$c" "$image" >/dev/null
  rm -f "$archive"
  "${b[@]}" push --quiet "$image" "oci-archive:$archive:$image"
  "${b[@]}" rm --all >/dev/null 2>&1 || true
  "${b[@]}" rmi --all >/dev/null 2>&1 || true
  rm -rf "$work"
}

build_pause() {
  # The sandbox image: the pause.c that ships with the pinned Kubernetes module, static.
  local src
  src="$(cd "$NODEIPAM_ROOT/hack/k8s" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
  [[ -f "$src" ]] || die "step=build-pause: $src not found"
  static_image "$src" pause "$PAUSE_IMAGE" "$PAUSE_ARCHIVE"
}

# The pods' traffic probe (hack/cluster/netprobe): its own folder and stamp, the C file's hash.
build_netprobe() {
  local src="$NODEIPAM_ROOT/hack/cluster/netprobe/netprobe.c" stamp
  stamp="$(sha256sum <"$src" | cut -c1-16)"
  if [[ -f "$NETPROBE_ARCHIVE" && "$(cat "$NETPROBE_DIR/.stamp" 2>/dev/null)" == "$stamp" ]]; then
    log "netprobe image up to date in $NETPROBE_ARCHIVE"
    return 0
  fi
  mkdir -p "$NETPROBE_DIR"
  timed "build the netprobe image" static_image "$src" netprobe "$NETPROBE_IMAGE" "$NETPROBE_ARCHIVE"
  echo "$stamp" >"$NETPROBE_DIR/.stamp"
}

# flanneld from hack/flannel (its own module, folder and stamp). CGO on: flannel's udp backend,
# which its main package always links, is C on amd64.
build_flanneld() {
  grep -q "^require github.com/flannel-io/flannel $FLANNEL_VERSION\$" "$NODEIPAM_ROOT/hack/flannel/go.mod" \
    || die "step=build-flanneld: hack/flannel/go.mod does not require flannel $FLANNEL_VERSION (FLANNEL_VERSION here)"
  local stamp
  stamp="$(cd "$NODEIPAM_ROOT/hack/flannel" && cat go.mod go.sum tencentcloud-vpc/go.mod tencentcloud-vpc/*/*.go \
    | sha256sum | cut -c1-16) $(go env GOVERSION)"
  if [[ -x "$FLANNEL_BIN/flanneld" && "$(cat "$FLANNEL_BIN/.stamp" 2>/dev/null)" == "$stamp" ]]; then
    log "flanneld $FLANNEL_VERSION up to date in $FLANNEL_BIN"
    return 0
  fi
  mkdir -p "$FLANNEL_BIN"
  timed "build flanneld $FLANNEL_VERSION" bash -c "cd '$NODEIPAM_ROOT/hack/flannel' && CGO_ENABLED=1 GOFLAGS=-mod=readonly \
    go build -trimpath -ldflags '-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$FLANNEL_VERSION' \
      -o '$FLANNEL_BIN/flanneld' github.com/flannel-io/flannel"
  echo "$stamp" >"$FLANNEL_BIN/.stamp"
}

cmd_build() {
  [[ $EUID -eq 0 ]] || die "step=build: run as root (namespaces, mounts, cgroups, apt)"
  install_packages
  command -v go >/dev/null || die "step=build: 'go' is not installed"
  # The control plane (apiserver, kcm, kubectl, etcd) has its own cache and stamp.
  "$NODEIPAM_ROOT/hack/control-plane.sh" build
  build_flanneld
  build_netprobe
  build_node_binaries
}

# kubelet, kube-proxy, kube-scheduler, containerd and the pause image: one folder, one stamp.
build_node_binaries() {
  local stamp
  stamp="$(cat "$NODEIPAM_ROOT"/hack/k8s/go.{mod,sum} "$NODEIPAM_ROOT"/hack/containerd/go.{mod,sum} \
    | sha256sum | cut -c1-16) rev=$NODE_BUILD_REV $(go env GOVERSION)"
  if [[ -f "$NODE_BIN/.stamp" && "$(cat "$NODE_BIN/.stamp")" == "$stamp" ]]; then
    log "node binaries up to date in $NODE_BIN"
    return 0
  fi
  mkdir -p "$NODE_BIN"
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local v ldk=""
  for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldk+=" -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor"
    ldk+=" -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
  done
  local cmd
  for cmd in kubelet kube-proxy kube-scheduler; do
    timed "build $cmd $K8S_VERSION" bash -c "cd '$NODEIPAM_ROOT/hack/k8s' && CGO_ENABLED=0 GOFLAGS=-mod=readonly \
      go build -trimpath -ldflags '-s -w$ldk' -o '$NODE_BIN/' k8s.io/kubernetes/cmd/$cmd"
  done
  timed "build containerd $CONTAINERD_VERSION" bash -c "cd '$NODEIPAM_ROOT/hack/containerd' && CGO_ENABLED=0 GOFLAGS=-mod=readonly \
    go build -trimpath -tags 'no_btrfs no_devmapper no_zfs' -ldflags '-s -w' -o '$NODE_BIN/' \
      github.com/containerd/containerd/v2/cmd/containerd \
      github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
      github.com/containerd/containerd/v2/cmd/ctr"
  timed "build the pause image" build_pause
  echo "$stamp" >"$NODE_BIN/.stamp"
}

# ---------------------------------------------------------------------------------------------
# certificates and kubeconfigs

PKI="$CLUSTER_DIR/pki"

# cert NAME CN ORG EKU [SANS]: an EC key and a certificate signed by the cluster CA.
cert() {
  local name="$1" cn="$2" org="$3" eku="$4" sans="${5:-}"
  local subj="/CN=$cn"; [[ -n "$org" ]] && subj+="/O=$org"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$subj" \
    -keyout "$PKI/$name.key" -out "$PKI/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [[ -n "$sans" ]] && echo "subjectAltName=$sans"
  } >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 30 -extfile "$PKI/$name.ext" \
    -out "$PKI/$name.crt" 2>/dev/null || die "step=certs: signing $name failed"
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

# kubeconfig NAME: a kubeconfig for the client certificate NAME.
kubeconfig() {
  local name="$1" b64='base64 -w0'
  cat >"$CLUSTER_DIR/$name.kubeconfig" <<EOF2
apiVersion: v1
kind: Config
clusters:
- name: nodeipam-local
  cluster:
    server: https://$CP_IP:$API_PORT
    certificate-authority-data: $($b64 <"$PKI/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $($b64 <"$PKI/$name.crt")
    client-key-data: $($b64 <"$PKI/$name.key")
contexts:
- name: nodeipam-local
  context: {cluster: nodeipam-local, user: $name}
current-context: nodeipam-local
EOF2
}

make_pki() {
  mkdir -p "$PKI"
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -subj "/CN=nodeipam-local-ca" -keyout "$PKI/ca.key" -out "$PKI/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null \
    || die "step=certs: CA"
  # The ServiceAccount token signing key (kube-apiserver signs, kcm's token controller too).
  openssl ecparam -name prime256v1 -genkey -noout 2>/dev/null | openssl pkcs8 -topk8 -nocrypt -out "$PKI/sa.key"
  openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  cert apiserver kube-apiserver "" serverAuth \
    "IP:$CP_IP,IP:127.0.0.1,IP:$KUBERNETES_SVC_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters clientAuth
  cert admin nodeipam-local-admin system:masters clientAuth
  cert kcm system:kube-controller-manager "" clientAuth
  cert scheduler system:kube-scheduler "" clientAuth
  cert kube-proxy system:kube-proxy "" clientAuth
  local n
  for n in admin kcm scheduler kube-proxy; do kubeconfig "$n"; done
}

# ---------------------------------------------------------------------------------------------
# processes: every daemon runs in a network namespace, in a tracking cgroup of the pids
# hierarchy (so `down` finds it and everything it forked), with its log in $CLUSTER_DIR/logs.

cgroup_dirs() { # every cgroup hierarchy mounted under /sys/fs/cgroup
  local d
  for d in /sys/fs/cgroup/*/; do [[ -d "$d" ]] && echo "${d%/}"; done
}

# mkcg PATH: creates cgroup PATH (e.g. /nipam-node-1) in every hierarchy.
mkcg() {
  local h
  for h in $(cgroup_dirs); do
    mkdir -p "$h$1"
    # A new cpuset group starts with no CPUs or memory nodes; give it its parent's.
    if [[ -f "$h$1/cpuset.cpus" && -z "$(cat "$h$1/cpuset.cpus")" ]]; then
      cat "$(dirname "$h$1")/cpuset.cpus" >"$h$1/cpuset.cpus"
      cat "$(dirname "$h$1")/cpuset.mems" >"$h$1/cpuset.mems"
    fi
  done
}

# spawn NAME NETNS CMD...: starts CMD in NETNS (network only: the mount namespace stays the
# host's, so the kubelet's volume mounts are seen by containerd) in the tracking cgroup
# /nipam-sys/NAME of the pids hierarchy.
spawn() {
  local name="$1" ns="$2"; shift 2
  local cg="/sys/fs/cgroup/pids/$CGROUP_PREFIX-sys/$name"
  mkdir -p "$cg"
  # shellcheck disable=SC2016 # expanded by the inner bash
  setsid bash -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
    nsenter --net="/run/netns/$ns" -- "$@" >"$CLUSTER_DIR/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$CLUSTER_DIR/pids/$name"
}

alive() { kill -0 "$(cat "$CLUSTER_DIR/pids/$1" 2>/dev/null || echo 0)" 2>/dev/null; }

# expect_alive NAME STEP: dies with the log's tail if NAME exited.
expect_alive() {
  alive "$1" || die "step=$2: $1 exited; log $CLUSTER_DIR/logs/$1.log:"$'\n'"$(tail -20 "$CLUSTER_DIR/logs/$1.log")"
}

# wait_daemon NAME STEP TIMEOUT CMD...: waits for CMD while NAME runs.
wait_daemon() {
  local name="$1" step="$2" timeout="$3"; shift 3
  local deadline=$(( $(now_ms) + timeout * 1000 ))
  until "$@" >/dev/null 2>&1; do
    expect_alive "$name" "$step"
    (( $(now_ms) < deadline )) || die "step=$step: $name not ready within ${timeout}s; log: $CLUSTER_DIR/logs/$name.log"$'\n'"$(tail -20 "$CLUSTER_DIR/logs/$name.log")"
    sleep 0.25
  done
}

# ---------------------------------------------------------------------------------------------
# network

make_netns() { # make_netns NS IP HOSTVETH
  local ns="$1" ip="$2" veth="$3"
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip link add "$veth" type veth peer name eth0 netns "$ns"
  ip link set "$veth" master "$BRIDGE" up
  ip -n "$ns" addr add "$ip/24" dev eth0
  ip -n "$ns" link set eth0 up
  # Service IPs are rewritten by kube-proxy in this namespace; a route must exist first.
  ip -n "$ns" route add default via "$HOST_IP"
}

make_bridge() {
  ip link add "$BRIDGE" type bridge
  ip addr add "$HOST_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
}

# ---------------------------------------------------------------------------------------------
# control plane

start_control_plane() {
  make_netns "$CP_NS" "$CP_IP" nipam-vcp
  mkcg "/$CGROUP_PREFIX-sys"
  spawn etcd "$CP_NS" "$NODEIPAM_ASSETS/etcd" --name=default --data-dir="$CLUSTER_DIR/etcd" \
    --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
    --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
    --initial-cluster=default=http://127.0.0.1:2380 --unsafe-no-fsync=true \
    --listen-metrics-urls=http://127.0.0.1:2381
  wait_daemon etcd start-etcd 60 ip netns exec "$CP_NS" curl -sf http://127.0.0.1:2379/health

  # Real ServiceAccounts: the admission plugin is on, tokens are signed with sa.key, and the
  # kubelets are authorized by the Node authorizer and NodeRestriction.
  spawn kube-apiserver "$CP_NS" "$NODEIPAM_ASSETS/kube-apiserver" \
    --advertise-address="$CP_IP" --bind-address=0.0.0.0 --secure-port="$API_PORT" \
    --etcd-servers=http://127.0.0.1:2379 --cert-dir="$CLUSTER_DIR/apiserver" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP
  wait_daemon kube-apiserver start-kube-apiserver 90 KUBECTL get --raw /readyz

  # Everything but node IPAM: that is nodeipam's job.
  spawn kube-controller-manager "$CP_NS" "$NODEIPAM_ASSETS/kube-controller-manager" \
    --kubeconfig="$CLUSTER_DIR/kcm.kubeconfig" --controllers='*,-node-ipam-controller' \
    --allocate-node-cidrs=false --leader-elect=false --bind-address=127.0.0.1 \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR"
  spawn kube-scheduler "$CP_NS" "$NODE_BIN/kube-scheduler" \
    --kubeconfig="$CLUSTER_DIR/scheduler.kubeconfig" --leader-elect=false --bind-address=127.0.0.1
  # The API server calls webhooks through their Service's ClusterIP: a kube-proxy in its
  # namespace programs that. Conntrack limits are left as the host has them (0 = unchanged).
  spawn kube-proxy-cp "$CP_NS" "$NODE_BIN/kube-proxy" \
    --kubeconfig="$CLUSTER_DIR/kube-proxy.kubeconfig" --hostname-override=nipam-control-plane \
    --bind-address="$CP_IP" --proxy-mode=iptables --conntrack-max-per-core=0 \
    --iptables-localhost-nodeports=false --nodeport-addresses=primary \
    --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0 \
    --metrics-bind-address=127.0.0.1:10249 --healthz-bind-address=127.0.0.1:10256
  # kcm publishes kube-root-ca.crt and creates the default ServiceAccounts: pods need both.
  wait_daemon kube-controller-manager start-kube-controller-manager 60 \
    KUBECTL -n default get serviceaccount default
  wait_daemon kube-controller-manager start-kube-controller-manager 60 \
    KUBECTL -n kube-system get configmap kube-root-ca.crt
  expect_alive kube-scheduler start-kube-scheduler
  expect_alive kube-proxy-cp start-kube-proxy
}

# ---------------------------------------------------------------------------------------------
# nodes

node_dir() { echo "$CLUSTER_DIR/nodes/$1"; }

write_containerd_config() { # DIR MTU
  local d="$1" mtu="$2"
  mkdir -p "$d/cni/net.d" "$d/runc"
  cat >"$d/containerd.toml" <<EOF2
version = 3
root = "$d/containerd/root"
state = "$d/containerd/state"
# Nothing from the host's containerd configuration.
imports = []
[grpc]
  address = "$d/containerd.sock"
[ttrpc]
  address = "$d/containerd.sock.ttrpc"
[plugins]
  # Nothing outside the node's folder: the opt plugin would create /opt/containerd, NRI a
  # socket in /run/nri shared by every containerd on the host, CDI reads /etc/cdi.
  [plugins."io.containerd.internal.v1.opt"]
    path = "$d/opt"
  [plugins."io.containerd.nri.v1.nri"]
    disable = true
  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "$PAUSE_IMAGE"
  [plugins."io.containerd.cri.v1.runtime"]
    # This VM denies lowering oom_score_adj; without this every sandbox fails with
    # "can't get final child's PID from pipe".
    restrict_oom_score_adj = true
    # Several containerds on one host: pod netns mounts under each one's state dir.
    netns_mounts_under_state_dir = true
    enable_cdi = false
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = "/usr/sbin/runc"
          Root = "$d/runc"
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["/usr/lib/cni"]
      conf_dir = "$d/cni/net.d"
      # The consumer of nodeipam's podCIDRs: once the kubelet passes the node's podCIDRs,
      # containerd writes this template out as the node's CNI config, and the node turns Ready.
      conf_template = "$d/cni/template.conflist"
EOF2
  if [[ "$(cni_mode)" == flannel ]]; then
    write_flannel_cni_template "$d" "$mtu"
  else
    cat >"$d/cni/template.conflist" <<'EOF2'
{"cniVersion": "0.4.0", "name": "@NETWORK@", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local",
            "ranges": [{{range $i, $range := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$range}}"}]{{end}}],
            "routes": [{{range $i, $route := .Routes}}{{if $i}}, {{end}}{"dst": "{{$route}}"}{{end}}],
            "dataDir": "@DIR@/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
EOF2
  fi
  sed -i "s|@NETWORK@|$CNI_NETWORK|; s|@DIR@|$d|" "$d/cni/template.conflist"
}

# write_flannel_cni_template DIR MTU: the stand-in for flannel's CNI plugin, which is not
# served by the Go module proxy. That plugin only turns flanneld's subnet.env into this same
# delegate: bridge cni0 as the pods' default gateway, host-local over the node's podCIDR
# (= FLANNEL_SUBNET, flanneld's lease is spec.podCIDRs), a route to flannel's Network, the
# backend's MTU (= FLANNEL_MTU) and the bridge's masquerade off, because flanneld runs with
# --ip-masq (the plugin sets ipMasq to !FLANNEL_IPMASQ). The bridge plugin's own masquerade
# would NAT every packet to another node's pods (docs/integrations.md, flannel).
write_flannel_cni_template() {
  local d="$1" mtu="$2"
  cat >"$d/cni/template.conflist" <<EOF2
{"cniVersion": "0.4.0", "name": "@NETWORK@", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "isDefaultGateway": true,
   "ipMasq": false, "hairpinMode": true, "mtu": $mtu,
   "ipam": {"type": "host-local",
            "ranges": [{{range \$i, \$range := .PodCIDRRanges}}{{if \$i}}, {{end}}[{"subnet": "{{\$range}}"}]{{end}}],
            "routes": [{"dst": "$(flannel_network)"}],
            "dataDir": "@DIR@/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
EOF2
}

write_kubelet_config() { # NAME DIR IP
  local name="$1" d="$2" ip="$3"
  cat >"$d/kubelet.yaml" <<EOF2
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
address: "$ip"
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: "$PKI/$name-serving.crt"
tlsPrivateKeyFile: "$PKI/$name-serving.key"
containerRuntimeEndpoint: "unix://$d/containerd.sock"
# cgroup v1 on this machine; each node's pods under its own root.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: "/$CGROUP_PREFIX-$name"
podLogsDir: "$d/pod-logs"
failSwapOn: false
# Small shared disk: do not evict or collect images because of it.
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: /etc/resolv.conf
registerNode: true
EOF2
}

# ---------------------------------------------------------------------------------------------
# flannel (`up --cni flannel`): flanneld on every node as a host process, as systemd would run
# it (restarted when it exits), with the kube subnet manager: each node's subnet is the
# podCIDR nodeipam wrote. Its settings are in $CLUSTER_DIR/flannel.

FLANNEL_DIR="$CLUSTER_DIR/flannel"

# cni_mode: bridge (the default: pods reach only their own node) or flannel.
cni_mode() { cat "$CLUSTER_DIR/cni" 2>/dev/null || echo bridge; }

flannel_network() { cat "$FLANNEL_DIR/network"; }

# pod_mtu NS: the pods' MTU on node NS: its eth0's, less vxlan's 50 bytes with that backend
# (what flanneld writes as FLANNEL_MTU).
pod_mtu() {
  local mtu
  mtu="$(ip netns exec "$1" cat /sys/class/net/eth0/mtu)"
  if [[ "$(cni_mode)" == flannel && "$(cat "$FLANNEL_DIR/backend")" == vxlan ]]; then
    mtu=$((mtu - 50))
  fi
  echo "$mtu"
}

# setup_flannel NETWORK BACKEND: its net-conf.json, its identity and RBAC (kube-flannel.yml's
# ClusterRole without `pods get`: NODE_NAME names the node). flanneld reads net-conf.json as a
# file; it is also published where kube-flannel.yml puts it, ConfigMap kube-flannel-cfg in
# namespace kube-flannel, which is where nodeipam learns flannel's Network (and warns outside it).
setup_flannel() {
  local network="$1" backend="$2"
  mkdir -p "$FLANNEL_DIR"
  echo "$network" >"$FLANNEL_DIR/network"
  echo "$backend" >"$FLANNEL_DIR/backend"
  printf '{"Network": "%s", "EnableIPv6": false, "Backend": {"Type": "%s"}}\n' "$network" "$backend" \
    >"$FLANNEL_DIR/net-conf.json"
  KUBECTL create namespace kube-flannel >/dev/null \
    || die "step=flannel-configmap: kubectl create namespace kube-flannel failed"
  KUBECTL -n kube-flannel create configmap kube-flannel-cfg \
    --from-file=net-conf.json="$FLANNEL_DIR/net-conf.json" >/dev/null \
    || die "step=flannel-configmap: kubectl create configmap kube-flannel-cfg failed"
  cert flannel nodeipam-local-flannel "" clientAuth
  kubeconfig flannel
  KUBECTL apply -f "$NODEIPAM_ROOT/hack/cluster/flannel-rbac.yaml" >/dev/null \
    || die "step=flannel-rbac: kubectl apply hack/cluster/flannel-rbac.yaml failed"
}

# start_flanneld NAME DIR: flanneld in node NAME's namespace. It exits 1 while the node has no
# podCIDR (or one outside Network); the loop restarts it a second later, as systemd's
# Restart=always would, and logs each exit.
start_flanneld() {
  local name="$1" d="$2"
  mkdir -p "$d/flannel"
  # shellcheck disable=SC2016 # expanded by the inner bash
  spawn "flanneld-$name" "nipam-$name" env NODE_NAME="$name" bash -c \
    'while :; do "$@"; echo "flanneld exited $?; restarting in 1s" >&2; sleep 1; done' _ \
    "$FLANNEL_BIN/flanneld" --kube-subnet-mgr --kubeconfig-file="$CLUSTER_DIR/flannel.kubeconfig" \
    --net-config-path="$FLANNEL_DIR/net-conf.json" --subnet-file="$d/flannel/subnet.env" \
    --iface=eth0 --ip-masq --healthz-port=0
}

# start_node NAME INDEX LABELS
start_node() {
  local name="$1" i="$2" labels="$3"
  local d ip ns="nipam-$name"
  d="$(node_dir "$name")"
  ip="$SUBNET_PREFIX.$((10 + i))"
  mkdir -p "$d/pod-logs" "$d/kubelet"
  echo "$i" >"$d/index"
  make_netns "$ns" "$ip" "nipam-v$i"
  cert "$name" "system:node:$name" system:nodes clientAuth
  cert "$name-serving" "system:node:$name" system:nodes serverAuth "IP:$ip,DNS:$name"
  kubeconfig "$name"
  mv "$CLUSTER_DIR/$name.kubeconfig" "$d/kubeconfig"
  write_containerd_config "$d" "$(pod_mtu "$ns")"
  write_kubelet_config "$name" "$d" "$ip"
  mkcg "/$CGROUP_PREFIX-$name"

  spawn "containerd-$name" "$ns" env PATH="$NODE_BIN:$PATH" "$NODE_BIN/containerd" --config "$d/containerd.toml"
  wait_daemon "containerd-$name" "start-containerd-$name" 30 \
    "$NODE_BIN/ctr" --address "$d/containerd.sock" version
  # Images: no registry; the pause image and nodeipam's, from their OCI archives.
  local archive
  for archive in "$PAUSE_ARCHIVE" "$NETPROBE_ARCHIVE" "$(NODEIPAM_IMAGE="$NODEIPAM_IMAGE" "$NODEIPAM_ROOT/hack/image.sh" path)"; do
    [[ -f "$archive" ]] || die "step=import-images-$name: $archive missing (hack/cluster.sh build, hack/image.sh)"
    "$NODE_BIN/ctr" --address "$d/containerd.sock" -n k8s.io images import --local "$archive" >/dev/null \
      || die "step=import-images-$name: ctr images import $archive failed"
  done

  spawn "kubelet-$name" "$ns" "$NODE_BIN/kubelet" --config="$d/kubelet.yaml" \
    --kubeconfig="$d/kubeconfig" --root-dir="$d/kubelet" --hostname-override="$name" \
    --node-ip="$ip" ${labels:+--node-labels="$labels"}
  # kube-proxy takes the local-traffic rules from the Node's podCIDR (NodeCIDR): it waits for
  # nodeipam like the CNI does.
  spawn "kube-proxy-$name" "$ns" "$NODE_BIN/kube-proxy" \
    --kubeconfig="$CLUSTER_DIR/kube-proxy.kubeconfig" --hostname-override="$name" \
    --bind-address="$ip" --proxy-mode=iptables --detect-local-mode=NodeCIDR \
    --conntrack-max-per-core=0 --conntrack-tcp-timeout-established=0 \
    --conntrack-tcp-timeout-close-wait=0 \
    --metrics-bind-address=127.0.0.1:10249 --healthz-bind-address=127.0.0.1:10256
  wait_daemon "kubelet-$name" "register-node-$name" 60 KUBECTL get node "$name"
  if [[ "$(cni_mode)" == flannel ]]; then start_flanneld "$name" "$d"; fi
}

next_index() {
  local i=1
  while [[ -e "$CLUSTER_DIR/nodes/node-$i" ]]; do i=$((i + 1)); done
  echo "$i"
}

cmd_add_node() {
  local labels=""
  while (($#)); do
    case "$1" in
      --labels) labels="${2:?--labels needs k=v[,k=v]}"; shift 2 ;;
      *) die "add-node: unknown argument '$1'" ;;
    esac
  done
  [[ -f "$CLUSTER_DIR/admin.kubeconfig" ]] || die "step=add-node: no cluster running (hack/cluster.sh up)"
  local i
  i="$(next_index)"
  timed "start node node-$i" start_node "node-$i" "$i" "$labels"
  echo "node-$i"
}

# kill_cgroup PATH: SIGKILLs every process in cgroup PATH of the pids hierarchy, repeatedly
# (a process may fork while we read), until it is empty.
kill_cgroup() {
  local cg="/sys/fs/cgroup/pids$1" tries=0 pids
  [[ -d "$cg" ]] || return 0
  while :; do
    # A cgroup removed while find walks (or cat reads it) makes find fail; under pipefail that
    # ended `down` with exit 1. What could be read is what matters: the loop reads again.
    pids="$({ find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null || true; } | tr '\n' ' ')"
    [[ -z "${pids// /}" ]] && return 0
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    tries=$((tries + 1))
    ((tries < 100)) || { log "warning: processes left in $cg: $pids"; return 1; }
    sleep 0.1
  done
}

# rmcg PATH: removes cgroup PATH (and its children) from every hierarchy.
rmcg() {
  local h
  for h in $(cgroup_dirs); do
    [[ -d "$h$1" ]] || continue
    find "$h$1" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

# umount_under DIR: unmounts every mount point below DIR, deepest first.
umount_under() {
  local dir="$1" m
  while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done < <(awk -v d="$dir" 'index($5, d"/") == 1 || $5 == d {print $5}' /proc/self/mountinfo | sort -r)
}

stop_node() { # NAME: every process of the node, its mounts, netns, cgroups and files
  local name="$1" d
  d="$(node_dir "$name")"
  local p
  # The kubelet first, so that it restarts nothing; then the pods, then containerd and shims.
  for p in "kubelet-$name" "kube-proxy-$name" "flanneld-$name"; do
    kill_cgroup "/$CGROUP_PREFIX-sys/$p"
  done
  kill_cgroup "/$CGROUP_PREFIX-$name"
  kill_cgroup "/$CGROUP_PREFIX-sys/containerd-$name"
  umount_under "$d"
  [[ -e "/run/netns/nipam-$name" ]] && ip netns del "nipam-$name"
  [[ -f "$d/index" ]] && ip link del "nipam-v$(cat "$d/index")" 2>/dev/null || true
  rmcg "/$CGROUP_PREFIX-$name"
  local cg
  for cg in "kubelet-$name" "kube-proxy-$name" "flanneld-$name" "containerd-$name"; do rmcg "/$CGROUP_PREFIX-sys/$cg"; done
  rm -f /var/lib/cni/results/"$CNI_NETWORK"-* 2>/dev/null || true
  find /var/log/containers -maxdepth 1 -lname "$d/*" -delete 2>/dev/null || true
  rm -rf "$d"
}

cmd_remove_node() {
  local name="${1:?remove-node NAME}"
  [[ -d "$(node_dir "$name")" ]] || die "step=remove-node: no node $name in $CLUSTER_DIR/nodes"
  timed "stop node $name" stop_node "$name"
}

# ---------------------------------------------------------------------------------------------
# up / down

save_sysctls() {
  [[ -f "$NODEIPAM_CACHE/cluster-sysctls.saved" ]] && return 0
  local s v
  for s in "${SYSCTLS[@]}"; do
    v="$(sysctl -n "$s" 2>/dev/null)" && printf '%s=%s\n' "$s" "$v"
  done >"$NODEIPAM_CACHE/cluster-sysctls.saved"
}

save_host_paths() {
  [[ -d "$HOST_SAVED" ]] && return 0
  mkdir -p "$HOST_SAVED"
  local p key
  for p in "${HOST_PATHS[@]}"; do
    key="$(echo "$p" | tr / _)"
    if [[ -e "$p" ]]; then
      find "$p" | sort >"$HOST_SAVED/$key.present"
    else
      touch "$HOST_SAVED/$key.absent"
    fi
  done
  # `ip netns add` makes /run/netns (a bind mount of itself) on first use.
  [[ -e /run/netns ]] || touch "$HOST_SAVED/run-netns.absent"
  # Everything iptables runs in the namespaces; the host's own tables must stay as they are.
  { iptables-save 2>/dev/null; ip6tables-save 2>/dev/null; } | grep -c '^:KUBE-' >"$HOST_SAVED/kube-chains" || true
}

restore_host_paths() {
  [[ -d "$HOST_SAVED" ]] || return 0
  local p key
  for p in "${HOST_PATHS[@]}"; do
    key="$(echo "$p" | tr / _)"
    if [[ -f "$HOST_SAVED/$key.absent" ]]; then
      rm -rf "$p"
    elif [[ -f "$HOST_SAVED/$key.present" && -e "$p" ]]; then
      # What was added since `up`, deepest first.
      find "$p" | sort | comm -13 "$HOST_SAVED/$key.present" - | sort -r | while IFS= read -r f; do
        rm -rf "$f"
      done
    fi
  done
  if [[ -f "$HOST_SAVED/run-netns.absent" && -d /run/netns && -z "$(ls -A /run/netns)" ]]; then
    while grep -q ' /run/netns ' /proc/self/mountinfo; do umount /run/netns || break; done
    rmdir /run/netns
  fi
  local before after
  before="$(cat "$HOST_SAVED/kube-chains" 2>/dev/null || echo 0)"
  after="$({ iptables-save 2>/dev/null; ip6tables-save 2>/dev/null; } | grep -c '^:KUBE-' || true)"
  if ((after > before)); then
    log "warning: the host's iptables gained KUBE- chains ($before -> $after); kept $HOST_SAVED"
    return 0
  fi
  rm -rf "$HOST_SAVED"
}

restore_sysctls() {
  local f="$NODEIPAM_CACHE/cluster-sysctls.saved" line failed=0
  [[ -f "$f" ]] || return 0
  while IFS= read -r line; do
    [[ "$(sysctl -n "${line%%=*}" 2>/dev/null)" == "${line#*=}" ]] && continue
    sysctl -q -w "$line" >/dev/null 2>&1 && [[ "$(sysctl -n "${line%%=*}")" == "${line#*=}" ]] \
      || { log "warning: could not restore $line"; failed=1; }
  done <"$f"
  # Kept when something could not be restored: check_clean reports it.
  ((failed)) || rm -f "$f"
}

cmd_up() {
  local nodes=2 cni=bridge network=10.112.0.0/12 backend=vxlan
  while (($#)); do
    case "$1" in
      --nodes) nodes="${2:?--nodes needs a number}"; shift 2 ;;
      --cni) cni="${2:?--cni needs bridge or flannel}"; shift 2 ;;
      --flannel-network) network="${2:?--flannel-network needs a CIDR}"; shift 2 ;;
      --flannel-backend) backend="${2:?--flannel-backend needs vxlan or host-gw}"; shift 2 ;;
      *) die "up: unknown argument '$1'" ;;
    esac
  done
  [[ "$cni" == bridge || "$cni" == flannel ]] || die "up: --cni must be bridge or flannel, got '$cni'"
  [[ "$backend" == vxlan || "$backend" == host-gw ]] || die "up: --flannel-backend must be vxlan or host-gw, got '$backend'"
  [[ "$network" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+/[0-9]+$ ]] || die "up: --flannel-network must be an IPv4 CIDR, got '$network'"
  [[ "$nodes" =~ ^[0-9]+$ ]] && ((nodes >= 1 && nodes <= 50)) || die "up: --nodes must be 1..50, got '$nodes'"
  [[ $EUID -eq 0 ]] || die "step=up: run as root (namespaces, mounts, cgroups)"
  local f
  local needed=("$NODEIPAM_ASSETS/kube-apiserver" "$NODEIPAM_ASSETS/etcd" "$NODE_BIN/kubelet" "$NODE_BIN/containerd" \
    "$PAUSE_ARCHIVE" "$NETPROBE_ARCHIVE")
  [[ "$cni" == flannel ]] && needed+=("$FLANNEL_BIN/flanneld")
  for f in "${needed[@]}"; do
    [[ -e "$f" ]] || die "step=up: $f missing: run hack/cluster.sh build"
  done
  [[ -f "$("$NODEIPAM_ROOT/hack/image.sh" path)" ]] || die "step=up: the nodeipam image is missing: run hack/image.sh"
  # Leftovers of a crashed run would clash with everything below.
  cmd_down
  local began=$SECONDS
  save_sysctls
  save_host_paths
  mkdir -p "$CLUSTER_DIR/logs" "$CLUSTER_DIR/pids" "$CLUSTER_DIR/nodes"
  timed "certificates" make_pki
  make_bridge
  timed "control plane" start_control_plane
  echo "$cni" >"$CLUSTER_DIR/cni"
  if [[ "$cni" == flannel ]]; then timed "flannel settings and RBAC" setup_flannel "$network" "$backend"; fi
  local i
  for i in $(seq 1 "$nodes"); do
    timed "start node node-$i" start_node "node-$i" "$i" ""
  done
  log "cluster up in $((SECONDS - began))s: $nodes node(s), CNI $cni, NotReady until they have podCIDRs"
  echo "export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig PATH=$NODEIPAM_ASSETS:\$PATH"
}

cmd_deploy() {
  local supernets=""
  while (($#)); do
    case "$1" in
      --pod-network-supernet) supernets="${2:?--pod-network-supernet needs CIDRs}"; shift 2 ;;
      *) die "deploy: unknown argument '$1'" ;;
    esac
  done
  [[ -f "$CLUSTER_DIR/admin.kubeconfig" ]] || die "step=deploy: no cluster running (hack/cluster.sh up)"
  # Exactly what users apply, through an overlay that only sets the image and, with the
  # api-server component, the API server's address (hack/cluster/overlay/kustomization.yaml
  # says why the address).
  timed "kubectl apply -k hack/cluster/overlay" KUBECTL apply -k "$NODEIPAM_ROOT/hack/cluster/overlay"
  if [[ -n "$supernets" ]]; then
    # The controller checks the list when it starts: a bad one fails the rollout below.
    KUBECTL -n nodeipam-system set env deployment/nodeipam-controller \
      NODEIPAM_POD_NETWORK_SUPERNETS="$supernets" >/dev/null \
      || die "step=deploy: setting NODEIPAM_POD_NETWORK_SUPERNETS failed"
  fi
  timed "nodeipam rollout" KUBECTL -n nodeipam-system rollout status deployment/nodeipam-controller --timeout=180s \
    || die "step=deploy: the nodeipam Deployment did not become available; $(KUBECTL -n nodeipam-system get pods -o wide 2>&1)"
  # The API server calls the webhook through its Service's ClusterIP, which works once the
  # control plane's kube-proxy has the rules (it first waits 30 s for a Node of its own name,
  # which the control plane does not have). Ready when a server-side dry run passes admission.
  timed "webhook reachable through its Service" wait_for deploy-webhook-through-service 120 webhook_answers
}

webhook_answers() {
  KUBECTL create --dry-run=server -o name -f - <<'EOF2'
apiVersion: nodeipam.io/v1alpha1
kind: NodeIPAMConfig
metadata: {name: nodeipam-deploy-check}
spec: {ipv4: {cidr: 198.51.100.0/24, perNodeMaskSize: 28}}
EOF2
}

cmd_down() {
  [[ $EUID -eq 0 ]] || die "step=down: run as root"
  local name
  if [[ -d "$CLUSTER_DIR/nodes" ]]; then
    for name in "$CLUSTER_DIR"/nodes/*; do [[ -d "$name" ]] && stop_node "${name##*/}"; done
  fi
  # Anything else of ours: nodes whose folder is gone, the control plane.
  local cg
  for cg in /sys/fs/cgroup/pids/"$CGROUP_PREFIX"-*; do
    [[ -d "$cg" ]] && kill_cgroup "/${cg##*/}"
  done
  umount_under "$CLUSTER_DIR"
  # The host ends of the veths first: a namespace's deletion destroys them only asynchronously.
  local link
  for link in $(ip -br link 2>/dev/null | awk '{print $1}' | sed 's/@.*//' | grep '^nipam-v' || true); do
    ip link del "$link" 2>/dev/null || true
  done
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^nipam-" || true); do ip netns del "$ns"; done
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
  local h
  for h in $(cgroup_dirs); do
    for cg in "$h"/"$CGROUP_PREFIX"-*; do [[ -d "$cg" ]] && rmcg "/${cg##*/}"; done
  done
  rm -f /var/lib/cni/results/"$CNI_NETWORK"-* 2>/dev/null || true
  [[ -d /var/log/containers ]] && find /var/log/containers -maxdepth 1 -lname "$CLUSTER_DIR/*" -delete
  restore_sysctls
  restore_host_paths
  # Keep the last run's logs; everything else goes.
  if [[ -d "$CLUSTER_DIR/logs" ]]; then
    rm -rf "$NODEIPAM_CACHE/cluster-last-logs" && mv "$CLUSTER_DIR/logs" "$NODEIPAM_CACHE/cluster-last-logs"
  fi
  rm -rf "$CLUSTER_DIR"
  check_clean
}

# check_clean: fails naming whatever of ours is still on the host.
check_clean() {
  local left=() i
  # Links of a deleted namespace may take a moment to go.
  for i in $(seq 1 20); do
    ip -br link 2>/dev/null | grep -q '^nipam-' || break
    sleep 0.1
  done
  ip netns list 2>/dev/null | grep -q '^nipam-' && left+=("netns: $(ip netns list | grep '^nipam-' | tr '\n' ' ')")
  ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("link $BRIDGE")
  ip -br link 2>/dev/null | grep -q '^nipam-' && left+=("links: $(ip -br link | grep '^nipam-' | awk '{print $1}' | tr '\n' ' ')")
  grep -q " $CLUSTER_DIR" /proc/self/mountinfo && left+=("mounts under $CLUSTER_DIR")
  compgen -G "/sys/fs/cgroup/*/$CGROUP_PREFIX-*" >/dev/null && left+=("cgroups: $(echo /sys/fs/cgroup/*/"$CGROUP_PREFIX"-*)")
  [[ -f "$NODEIPAM_CACHE/cluster-sysctls.saved" ]] && left+=("sysctls not restored")
  [[ -d "$HOST_SAVED" ]] && left+=("host folders not restored")

  if ((${#left[@]})); then
    die "step=down: left behind: ${left[*]}"
  fi
  log "cluster down; nothing left behind"
}

case "${1:-}" in
  build) cmd_build ;;
  up) shift; cmd_up "$@" ;;
  deploy) shift; cmd_deploy "$@" ;;
  add-node) shift; cmd_add_node "$@" ;;
  remove-node) shift; cmd_remove_node "$@" ;;
  kubectl) shift; KUBECTL "$@" ;;
  down) cmd_down ;;
  *) echo "usage: $0 build | up [--nodes N] [--cni bridge|flannel] [--flannel-network CIDR] [--flannel-backend vxlan|host-gw] | deploy [--pod-network-supernet CIDRS] | add-node [--labels k=v,...] | remove-node NAME | kubectl ARGS... | down" >&2; exit 2 ;;
esac
