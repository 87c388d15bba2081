# Sourced by the install scripts and .ci/run: free disk space, so that a
# download that fills the disk says so instead of ending in pip's traceback.

# free_gib DIR: whole GiB free on the file system that holds DIR (or its
# nearest existing parent).
free_gib() {
    local dir="$1"
    while [[ ! -e "${dir}" && "${dir}" != / ]]; do dir="$(dirname "${dir}")"; done
    df -Pk "${dir}" 2>/dev/null | awk 'NR == 2 { print int($4 / 1048576) }'
}

# warn_if_short NEED_GIB DIR WHAT: one line on stderr when DIR's file system
# has less than NEED_GIB free (a warning only: the estimate may be high).
warn_if_short() {
    local need="$1" dir="$2" what="$3" free
    free="$(free_gib "${dir}")"
    [[ -n "${free}" ]] || return 0
    if ((free < need)); then
        echo "warning: ${what} needs about ${need} GiB free; $(disk_report "${dir}") (PIP_NO_CACHE_DIR=1 saves pip's copy of each download)" >&2
    fi
}

# disk_report DIR: "N GiB free on MOUNT", for a failure message.
disk_report() {
    local dir="$1"
    while [[ ! -e "${dir}" && "${dir}" != / ]]; do dir="$(dirname "${dir}")"; done
    df -Ph "${dir}" 2>/dev/null | awk 'NR == 2 { print $4 " free on " $6 }'
}
