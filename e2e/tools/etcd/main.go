// The etcd server for the local real cluster (scripts/cluster.sh): etcd's
// own entry point from its published server module. etcd's root module
// has relative replace directives and cannot be built from the module
// cache, so this is the smallest module that reaches the same code.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
