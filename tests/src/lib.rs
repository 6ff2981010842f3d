//! The control-plane harness: starts etcd and kube-apiserver on loopback for tests.
