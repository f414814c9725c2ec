// Prints KubeVirt's own VirtualMachineInstance and VirtualMachine CRDs,
// as virt-operator generates them (kubevirt.io/kubevirt v1.4.0), for the
// IPAMClaim tests on the real kube-apiserver (scripts/tools.sh). KubeVirt's
// controllers do not run there; the harness plays virt-controller's part.
package main

import (
	"fmt"
	"os"

	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
	"sigs.k8s.io/yaml"

	// The IPAMClaim types, so that this module pins the ipamclaims version
	// whose CRD (artifacts/) the tests install.
	_ "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
)

func main() {
	for _, gen := range []func() (interface{}, error){
		func() (interface{}, error) { return components.NewVirtualMachineInstanceCrd() },
		func() (interface{}, error) { return components.NewVirtualMachineCrd() },
	} {
		crd, err := gen()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		out, err := yaml.Marshal(crd)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("---\n%s", out)
	}
}
