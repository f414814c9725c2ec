# shellcheck shell=bash
# Sourced by scripts/cluster.sh, which sets ROOT, C, B, BIN and the other
# settings and defines log, die, node_ip and stamp. This part: a cgroup root
# per component group in every hierarchy, and killing one without letting a
# fork escape.
# It only defines; the commands in commands.sh run it.

# Every cgroup hierarchy mounted on the host (v1 controllers, name=systemd,
# the hybrid unified one).
hierarchies() { findmnt -rn -t cgroup,cgroup2 -o TARGET; }

# make_cgroup PATH: PATH (e.g. /smc-node1/system) in every hierarchy; a
# new cpuset inherits its parent's cpus and mems, or no task may join it.
make_cgroup() {
    local h dir part sofar
    for h in $(hierarchies); do
        sofar=$h
        for part in ${1//\// }; do
            dir=$sofar/$part
            if [ ! -d "$dir" ]; then
                mkdir "$dir"
                if [ -f "$sofar/cpuset.cpus" ]; then
                    cat "$sofar/cpuset.cpus" >"$dir/cpuset.cpus"
                    cat "$sofar/cpuset.mems" >"$dir/cpuset.mems"
                fi
            fi
            sofar=$dir
        done
    done
}

# The command that moves the calling shell into cgroup PATH everywhere.
join_cgroup_cmd() {
    local h cmd=""
    for h in $(hierarchies); do cmd+="echo \$\$ > $h$1/cgroup.procs; "; done
    echo "$cmd"
}

cgroup_pids() {
    local h=/sys/fs/cgroup/pids
    [ -d "$h" ] || h=$(hierarchies | head -1)
    [ -d "$h$1" ] || return 0
    find "$h$1" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -un
}

# kill_cgroup PATH: freeze (no fork escapes), SIGKILL every task, thaw,
# wait until empty, then remove PATH from every hierarchy.
kill_cgroup() {
    local f=/sys/fs/cgroup/freezer$1 pids i h
    [ -d "$f" ] && echo FROZEN >"$f/freezer.state" 2>/dev/null || true
    for i in $(seq 1 50); do
        pids=$(cgroup_pids "$1")
        [ -z "$pids" ] && break
        # shellcheck disable=SC2086
        kill -9 $pids 2>/dev/null || true
        [ -d "$f" ] && echo THAWED >"$f/freezer.state" 2>/dev/null || true
        sleep 0.1
    done
    for h in $(hierarchies); do
        [ -d "$h$1" ] && find "$h$1" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
    for h in $(hierarchies); do
        [ -d "$h$1" ] && log "warning: cgroup $h$1 could not be removed"
    done
    return 0
}
