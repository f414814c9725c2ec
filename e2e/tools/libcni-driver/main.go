// libcni-driver drives a CNI network list through the real libcni
// (github.com/containernetworking/cni, pinned in go.mod), the library
// container runtimes and Multus use, with Multus-style CNI_ARGS and
// capability args.
//
// Usage: libcni-driver -conflist F -netns P -container ID -ifname N
//        -cni-path DIRS -cache-dir D [-mac M] [-ips A,B]
//        [-valid ID/IFNAME,...] ACTION...
// ACTION is add, check, del, gc (with -valid as the valid attachments) or
// status; add prints the result JSON on stdout.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func main() {
	conflist := flag.String("conflist", "", "network list file")
	netns := flag.String("netns", "", "pod netns path")
	container := flag.String("container", "", "container id")
	ifname := flag.String("ifname", "net1", "interface name")
	cniPath := flag.String("cni-path", "", "colon-separated plugin dirs")
	cacheDir := flag.String("cache-dir", "", "libcni result cache dir")
	podNS := flag.String("pod-namespace", "default", "K8S_POD_NAMESPACE")
	podName := flag.String("pod-name", "pod-0", "K8S_POD_NAME")
	podUID := flag.String("pod-uid", "00000000-0000-0000-0000-000000000001", "K8S_POD_UID")
	mac := flag.String("mac", "", "capability arg mac")
	ips := flag.String("ips", "", "capability arg ips (comma separated)")
	valid := flag.String("valid", "", "gc: the valid attachments, ID/IFNAME comma separated")
	flag.Parse()

	list, err := libcni.ConfListFromFile(*conflist)
	if err != nil {
		fail("load %s: %v", *conflist, err)
	}
	cni := libcni.NewCNIConfigWithCacheDir(strings.Split(*cniPath, ":"), *cacheDir, nil)
	rt := &libcni.RuntimeConf{
		ContainerID: *container,
		NetNS:       *netns,
		IfName:      *ifname,
		// Exactly as Multus sends them, IgnoreUnknown repeated.
		Args: [][2]string{
			{"IgnoreUnknown", "true"},
			{"K8S_POD_NAMESPACE", *podNS},
			{"K8S_POD_NAME", *podName},
			{"K8S_POD_INFRA_CONTAINER_ID", *container},
			{"K8S_POD_UID", *podUID},
			{"IgnoreUnknown", "1"},
		},
		CapabilityArgs: map[string]interface{}{},
	}
	if *mac != "" {
		rt.CapabilityArgs["mac"] = *mac
	}
	if *ips != "" {
		rt.CapabilityArgs["ips"] = strings.Split(*ips, ",")
	}
	ctx := context.Background()
	for _, action := range flag.Args() {
		switch action {
		case "add":
			res, err := cni.AddNetworkList(ctx, list, rt)
			if err != nil {
				fail("add: %v", err)
			}
			out, err := json.Marshal(res)
			if err != nil {
				fail("encode result: %v", err)
			}
			fmt.Println(string(out))
		case "check":
			if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
				fail("check: %v", err)
			}
		case "del":
			if err := cni.DelNetworkList(ctx, list, rt); err != nil {
				fail("del: %v", err)
			}
		case "gc":
			args := &libcni.GCArgs{}
			for _, a := range strings.Split(*valid, ",") {
				if id, ifname, ok := strings.Cut(a, "/"); ok {
					args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: id, IfName: ifname})
				}
			}
			if err := cni.GCNetworkList(ctx, list, args); err != nil {
				fail("gc: %v", err)
			}
		case "status":
			if err := cni.GetStatusNetworkList(ctx, list); err != nil {
				fail("status: %v", err)
			}
		default:
			fail("unknown action %q", action)
		}
	}
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "libcni-driver: "+format+"\n", args...)
	os.Exit(1)
}
