#!/usr/bin/env bash
# Packs a root filesystem directory into a docker-archive tarball that
# `ctr images import` and `podman load` read, without a registry or an image
# builder: one layer, a config naming the entrypoint, a manifest with the tag.
#   docker-archive.sh ROOTFS NAME:TAG ENTRYPOINT OUT.tar
set -euo pipefail
rootfs=$1 tag=$2 entry=$3 out=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Reproducible: fixed owner, order and times.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$work/layer.tar" .
diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
cat >"$work/config.json" <<JSON
{"architecture":"amd64","os":"linux","config":{"Entrypoint":["$entry"],"Env":["PATH=/bin:/usr/bin:/sbin:/usr/sbin"]},"rootfs":{"type":"layers","diff_ids":["sha256:$diff_id"]},"history":[{"created_by":"e2e/images/docker-archive.sh"}]}
JSON
config_id=$(sha256sum "$work/config.json" | cut -d' ' -f1)
mv "$work/config.json" "$work/$config_id.json"
mkdir "$work/$diff_id"
mv "$work/layer.tar" "$work/$diff_id/layer.tar"
printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]\n' "$config_id" "$tag" "$diff_id" >"$work/manifest.json"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work" -cf "$out" manifest.json "$config_id.json" "$diff_id"
