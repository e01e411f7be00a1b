#!/usr/bin/env bash
# ebpf-cni on one node: `make install` and `make uninstall` run this.
#
#   install.sh install    the plugins (and loopback where there is none)
#                         into $DESTDIR$CNI_BIN_DIR and, unless a
#                         file of that name is there (FORCE=1 replaces it), a
#                         conflist for $POD_CIDR into $DESTDIR$CNI_CONF_DIR
#   install.sh uninstall  removes exactly what install wrote
#
# install records every file and directory it created in a manifest next to
# the plugins ($CNI_BIN_DIR/.ebpf-cni.installed; runtimes ignore it), and
# uninstall removes those and nothing else: a conflist that was there before
# and kept, another plugin's binaries, a directory that held something else.
# Run both with the same DESTDIR and CNI_BIN_DIR.
set -euo pipefail
export LC_ALL=C # globs sort as runtimes sort file names

cmd=${1:-}
DESTDIR=${DESTDIR:-}
CNI_BIN_DIR=${CNI_BIN_DIR:-/opt/cni/bin}
CNI_CONF_DIR=${CNI_CONF_DIR:-/etc/cni/net.d}
CNI_CONF_FILE=${CNI_CONF_FILE:-10-ebpf-cni.conflist}
BIN=${BIN:-bin}
POD_CIDR=${POD_CIDR:-}
CLUSTER_CIDRS=${CLUSTER_CIDRS:-}
MASQUERADE=${MASQUERADE:-true}
FORCE=${FORCE:-}
BPF_ROOT=${BPF_ROOT:-}
STATE_DIR=${STATE_DIR:-}
manifest="$DESTDIR$CNI_BIN_DIR/.ebpf-cni.installed"

die() {
	echo "make $cmd: $*" >&2
	exit 2
}

# mkdirs DIR creates DIR and its missing parents under DESTDIR and records
# "dir D" for each it made, outermost first.
record=()
mkdirs() {
	local d=$1 missing=()
	# dirname / is /: stop there. A DESTDIR that does not exist yet is a
	# staging root: it is made (with its parents) and, like any DESTDIR,
	# not recorded, so uninstall leaves it, empty.
	while [ ! -e "$DESTDIR$d" ] && [ "$d" != / ]; do
		missing=("$d" "${missing[@]}")
		d=$(dirname "$d")
	done
	[ -e "$DESTDIR$d" ] || mkdir -p -m 0755 "$DESTDIR" || die "cannot create DESTDIR $DESTDIR"
	[ -d "$DESTDIR$d" ] || die "$DESTDIR$d is not a directory"
	for d in "${missing[@]}"; do
		mkdir -m 0755 "$DESTDIR$d"
		record+=("dir $d")
	done
}

# put SRC DST MODE copies through a temporary file and a rename: a runtime
# may exec the plugin or read the conflist at any moment, and must find the
# old file or the new one, never half of one. One write of the whole file
# (dd, not cp's 128 KiB pieces): a filesystem with large folios (xfs; ext4
# on recent kernels, 6.18 here) then caches a plugin in 2 MiB folios, and
# each exec of it faults in fewer pages (docs/performance.md, ninth pass).
put() {
	local tmp
	tmp=$(mktemp "$(dirname "$2")/.$(basename "$2").XXXXXX.tmp")
	dd if="$1" of="$tmp" bs=64M status=none && chmod "$3" "$tmp" && mv -f "$tmp" "$2" || {
		rm -f "$tmp"
		die "writing $2 failed"
	}
}

install_node() {
	[ -n "$POD_CIDR" ] || die "POD_CIDR is required: this node's pod range, e.g. POD_CIDR=10.244.1.0/24 (dual stack: POD_CIDR=10.244.1.0/24,fd00:10:244:1::/64)"
	for b in ebpf-cni ebpf-ipam loopback; do
		[ -x "$BIN/$b" ] || die "$BIN/$b is missing (make build)"
	done
	[ -z "$DESTDIR" ] || [ "${DESTDIR:0:1}" = / ] || die "DESTDIR must be an absolute path, not $DESTDIR"

	# Everything is checked before anything is written: bad input leaves
	# nothing behind.
	conf=$(mktemp)
	trap 'rm -f "$conf"' EXIT
	local args=(conflist --pod-cidr "$POD_CIDR" --masquerade="$MASQUERADE")
	[ -z "$CLUSTER_CIDRS" ] || args+=(--cluster-cidrs "$CLUSTER_CIDRS")
	[ -z "$BPF_ROOT" ] || args+=(--bpf-root "$BPF_ROOT")
	[ -z "$STATE_DIR" ] || args+=(--state-dir "$STATE_DIR")
	"$BIN/ebpf-cni" "${args[@]}" >"$conf" || die "nothing installed (fix the variable named above)"

	mkdirs "$CNI_BIN_DIR"
	mkdirs "$CNI_CONF_DIR"
	for b in ebpf-cni ebpf-ipam; do
		put "$BIN/$b" "$DESTDIR$CNI_BIN_DIR/$b" 0755
		record+=("file $CNI_BIN_DIR/$b")
		echo "installed $DESTDIR$CNI_BIN_DIR/$b"
	done
	# Runtimes run loopback for every pod (containerd before ebpf-cni):
	# without one, each pod's ADD fails after ours and our DEL never comes.
	# Ours goes where the bin dir has none (or has ours), never over another.
	if [ ! -e "$DESTDIR$CNI_BIN_DIR/loopback" ] || grep -qx "file $CNI_BIN_DIR/loopback" "$manifest" 2>/dev/null; then
		put "$BIN/loopback" "$DESTDIR$CNI_BIN_DIR/loopback" 0755
		record+=("file $CNI_BIN_DIR/loopback")
		echo "installed $DESTDIR$CNI_BIN_DIR/loopback (the runtime runs it for every pod; there was none)"
	else
		echo "kept the existing $DESTDIR$CNI_BIN_DIR/loopback"
	fi

	local target="$DESTDIR$CNI_CONF_DIR/$CNI_CONF_FILE"
	if [ -e "$target" ] && [ "$FORCE" != 1 ]; then
		if cmp -s "$conf" "$target"; then
			echo "unchanged $target"
		else
			echo "kept the existing $target (FORCE=1 replaces it); it differs from:" >&2
			sed 's/^/    /' "$conf" >&2
		fi
	else
		put "$conf" "$target" 0644
		record+=("file $CNI_CONF_DIR/$CNI_CONF_FILE")
		echo "wrote $target"
	fi
	# A runtime uses the first configuration in lexical order.
	local first="" f
	for f in "$DESTDIR$CNI_CONF_DIR"/*; do
		case $f in *.conf | *.conflist | *.json)
			first=$(basename "$f")
			break
			;;
		esac
	done
	if [ -n "$first" ] && [ "$first" != "$CNI_CONF_FILE" ]; then
		echo "note: $DESTDIR$CNI_CONF_DIR/$first sorts before $CNI_CONF_FILE: runtimes that take the first file use it (docs/deploy.md)" >&2
	fi

	# The new manifest is the old one plus what this run wrote: reinstalling
	# over an install keeps the record of its directories and conflist.
	local tmp
	tmp=$(mktemp "$DESTDIR$CNI_BIN_DIR/.ebpf-cni.installed.XXXXXX.tmp")
	{
		[ ! -f "$manifest" ] || cat "$manifest"
		printf '%s\n' "${record[@]}"
	} | awk '!seen[$0]++' >"$tmp"
	chmod 0644 "$tmp"
	mv -f "$tmp" "$manifest"
}

uninstall_node() {
	if [ ! -f "$manifest" ]; then
		echo "no $manifest: nothing was installed here by make install (same DESTDIR and CNI_BIN_DIR?)"
		return
	fi
	local kind path dirs=()
	while read -r kind path; do
		case $kind in
		file)
			if [ -e "$DESTDIR$path" ]; then
				rm -f "$DESTDIR$path"
				echo "removed $DESTDIR$path"
			fi
			;;
		dir) dirs=("$path" "${dirs[@]}") ;; # innermost first
		*) die "unexpected line in $manifest: $kind $path" ;;
		esac
	done <"$manifest"
	rm -f "$manifest"
	for path in "${dirs[@]}"; do
		if [ -d "$DESTDIR$path" ]; then
			if rmdir "$DESTDIR$path" 2>/dev/null; then
				echo "removed $DESTDIR$path/"
			else
				echo "kept $DESTDIR$path/ (it holds files make install did not write)"
			fi
		fi
	done
}

case $cmd in
install) install_node ;;
uninstall) uninstall_node ;;
*) die "usage: $0 install|uninstall" ;;
esac
