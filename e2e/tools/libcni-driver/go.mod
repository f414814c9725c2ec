// The libcni test driver, built against the libcni the issue asks for:
// the current release, which speaks CNI 1.1.0 (GC, STATUS).
module sticky-macvlan.test/tools/libcni-driver

go 1.24

require github.com/containernetworking/cni v1.3.0
