# shellcheck shell=bash
# Sourced by scripts/cluster.sh, which sets ROOT, C, B, BIN and the other
# settings and defines log, die, node_ip and stamp. This part: the test CA,
# the components' certificates and the kubeconfigs.
# It only defines; the commands in commands.sh run it.

cert() { # NAME CN O [SANs]
    local name=$1 cn=$2 o=$3 san=${4:-}
    local p=$C/pki
    openssl genrsa -out "$p/$name.key" 2048 2>/dev/null
    local ext
    ext=$(mktemp)
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$ext"
    [ -z "$san" ] || echo "subjectAltName=$san" >>"$ext"
    openssl req -new -key "$p/$name.key" -subj "/CN=$cn${o:+/O=$o}" -out "$p/$name.csr" 2>/dev/null
    openssl x509 -req -in "$p/$name.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
        -days 30 -extfile "$ext" -out "$p/$name.crt" 2>/dev/null
    rm -f "$ext" "$p/$name.csr"
}

pki() {
    local p=$C/pki
    mkdir -p "$p"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$p/ca.key" -out "$p/ca.crt" \
        -subj "/CN=sticky-macvlan-test-ca" -days 30 2>/dev/null
    cert apiserver kube-apiserver "" \
        "IP:127.0.0.1,IP:$CP_IP,IP:$SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    cert apiserver-kubelet-client kube-apiserver-kubelet-client ""
    cert admin admin system:masters
    cert controller-manager system:kube-controller-manager ""
    cert scheduler system:kube-scheduler ""
    cert kube-proxy system:kube-proxy ""
    openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
    openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
}

kubeconfig() { # FILE SERVER USER [CERT-NAME | token=TOKEN]
    local file=$1 server=$2 user=$3 cred=$4 p=$C/pki
    {
        printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: %s\n    certificate-authority: %s\n' "$server" "$p/ca.crt"
        printf 'users:\n- name: %s\n  user:\n' "$user"
        case $cred in
        token=*) printf '    token: %s\n' "${cred#token=}" ;;
        *) printf '    client-certificate: %s\n    client-key: %s\n' "$p/$cred.crt" "$p/$cred.key" ;;
        esac
        printf 'contexts:\n- name: local\n  context:\n    cluster: local\n    user: %s\ncurrent-context: local\n' "$user"
    } >"$file"
}
