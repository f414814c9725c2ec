//! `crd`: the IPClaim and IPLock CustomResourceDefinitions as YAML, made
//! from the types the store writes (`sticky_ipam::kube::crd`).

use std::process::ExitCode;

pub fn main(program: &str) -> ExitCode {
    match sticky_ipam::kube::crd::definitions()
        .iter()
        .map(serde_saphyr::to_string)
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(docs) => {
            print!("{}", docs.join("---\n"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{program} crd: cannot write the definitions as YAML: {e}");
            ExitCode::from(1)
        }
    }
}
