#!/usr/bin/env bash
# Set up an emulated aarch64 "device" for Kiln's ARM tests on an x86_64 Debian 12 host (run as root).
#
#   scripts/setup_arm.sh [DIR]        DIR defaults to .arm in the repository
#
# Host: apt-get installs qemu-user (qemu-aarch64), the aarch64 cross g++ and binutils, unzip.
# DIR/sysroot: arm64 Debian packages (python3.11 and the C/C++ runtime libraries) unpacked with
#   dpkg -x; nothing arm64 is installed into the system root.
# DIR/site:    the aarch64 wheels of the TVM runtime, tvm-ffi, numpy, ml_dtypes, ... pinned to the
#   versions installed in Kiln's venv (PIP, default .venv/bin/pip), plus a sitecustomize.py.
# DIR/bin/arm-python: runs the aarch64 python3.11 under qemu-aarch64 with DIR/site on its path.
#
# Only this script downloads. It is idempotent: DIR/.stamp records the script, the pinned
# versions and the package lists; when it matches and the host tools exist, it exits at once.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARM=${1:-$REPO/.arm}
PIP=${PIP:-$REPO/.venv/bin/pip}

HOST_PKGS=(qemu-user g++-aarch64-linux-gnu binutils-aarch64-linux-gnu unzip)
HOST_TOOLS=(qemu-aarch64 aarch64-linux-gnu-g++ aarch64-linux-gnu-objdump unzip setpriv)
# python3.11 and what its stdlib modules, numpy and the TVM runtime link against.
SYSROOT_PKGS=(
    libc6 libgcc-s1 libstdc++6 zlib1g libexpat1 libffi8 libssl3 libbz2-1.0 liblzma5
    libcrypt1 libuuid1 libpython3.11-minimal libpython3.11-stdlib python3.11-minimal
)
# Device-side Python packages (tvm.exec.rpc_server needs cloudpickle for its popen worker).
WHEELS=(apache-tvm apache-tvm-ffi numpy ml_dtypes typing_extensions cloudpickle)

die() { echo "setup_arm.sh: error: $*" >&2; exit 1; }

[[ -x $PIP || $PIP == *" "* ]] || die "no pip at $PIP (run 'make venv' first, or set PIP to the venv's pip)"

# The versions Kiln's venv runs with: host and device must agree (RPC protocol, tensor layout).
freeze=$($PIP list --format=freeze --disable-pip-version-check 2>/dev/null) || die "$PIP list failed"
pins=()
for pkg in "${WHEELS[@]}"; do
    norm=$(tr '_' '-' <<<"$pkg" | tr '[:upper:]' '[:lower:]')
    ver=$(awk -F'==' -v p="$norm" '{n=tolower($1); gsub("_","-",n)} n==p {print $2}' <<<"$freeze")
    [[ -n $ver ]] || die "$pkg is not installed in the venv of $PIP; cannot pin the aarch64 wheel"
    pins+=("$pkg==$ver")
done

stamp_key=$(
    { cat "${BASH_SOURCE[0]}"; printf '%s\n' "${pins[@]}" "${SYSROOT_PKGS[@]}"; } | sha256sum | cut -c1-16
)
tools_ok() {
    local t
    for t in "${HOST_TOOLS[@]}"; do command -v "$t" >/dev/null || return 1; done
}
if [[ -f $ARM/.stamp && $(cat "$ARM/.stamp") == "$stamp_key" && -x $ARM/bin/arm-python ]] && tools_ok; then
    echo "setup_arm.sh: $ARM is up to date (${pins[*]})"
    exit 0
fi

[[ $(id -u) -eq 0 ]] || die "run as root (apt-get installs the host tools and reads arm64 package indices)"
command -v apt-get >/dev/null || die "needs a Debian 12 host with apt-get"
t0=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
rm -f "$ARM/.stamp"
mkdir -p "$ARM"/{debs,wheels,bin}

# --- 1. host tools and the arm64 package indices --------------------------------------------------
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "setup_arm.sh: dpkg --add-architecture arm64 (package indices only; nothing arm64 is installed)"
    dpkg --add-architecture arm64
fi
apt-get update -qq
missing=()
for p in "${HOST_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup_arm.sh: apt-get install ${missing[*]}"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
tools_ok || die "host tools missing after install: ${HOST_TOOLS[*]}"

# --- 2. the arm64 sysroot: apt-get download + dpkg -x ---------------------------------------------
echo "setup_arm.sh: arm64 sysroot (${#SYSROOT_PKGS[@]} packages)"
rm -rf "$ARM/sysroot" "$ARM/debs"/*.deb
mkdir -p "$ARM/sysroot"
(
    cd "$ARM/debs"
    # As root, apt-get download may warn that it downloads "unsandboxed": harmless here.
    apt-get download -qq "${SYSROOT_PKGS[@]/%/:arm64}" media-types
    for deb in *.deb; do dpkg -x "$deb" "$ARM/sysroot"; done
)
[[ -x $ARM/sysroot/usr/bin/python3.11 ]] || die "the arm64 python3.11 did not unpack into $ARM/sysroot"

# --- 3. aarch64 wheels ------------------------------------------------------------------------------
echo "setup_arm.sh: aarch64 wheels ${pins[*]}"
rm -f "$ARM/wheels"/*.whl
$PIP download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux_2_28_aarch64 --python-version 3.11 --implementation cp \
    -d "$ARM/wheels" "${pins[@]}"
rm -rf "$ARM/site"
mkdir -p "$ARM/site"
for whl in "$ARM"/wheels/*.whl; do
    case $(basename "$whl") in
        apache_tvm-*)  # runtime only on the device: skip the compiler library and bundled headers
            unzip -qo "$whl" -d "$ARM/site" -x 'tvm/lib/libtvm_compiler.so' 'tvm/3rdparty/*' 'tvm/include/*' ;;
        *) unzip -qo "$whl" -d "$ARM/site" ;;
    esac
done

# --- 4. sitecustomize.py and the arm-python wrapper ----------------------------------------------
# Without binfmt_misc the emulated python cannot exec() an aarch64 binary, but TVM's RPC server
# re-launches sys.executable for its popen worker: point sys.executable at the x86 wrapper script.
cat >"$ARM/site/sitecustomize.py" <<'EOF'
"""Emulated aarch64 python: child interpreters must start through the host's arm-python wrapper."""
import os
import sys

sys.executable = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bin", "arm-python")
EOF
cat >"$ARM/bin/arm-python" <<'EOF'
#!/usr/bin/env bash
# python3.11 for aarch64, run by qemu-aarch64, with the aarch64 TVM runtime on its path
# (written by Kiln's scripts/setup_arm.sh; relocatable with its folder).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONHOME="$root/sysroot/usr"
export PYTHONPATH="$root/site"
export PYTHONNOUSERSITE=1
export TVM_USE_RUNTIME_LIB=1
# SIGTERM when the parent dies: an RPC server's workers must not outlive a killed server.
exec setpriv --pdeathsig TERM qemu-aarch64 -L "$root/sysroot" "$root/sysroot/usr/bin/python3.11" "$@"
EOF
chmod +x "$ARM/bin/arm-python"

# Byte-compile on the host (.pyc files are the same for every 3.11 build): saves emulated time.
py=$(dirname "$PIP")/python
if [[ -x $py ]]; then
    "$py" -m compileall -q -j 0 "$ARM/site" "$ARM/sysroot/usr/lib/python3.11" >/dev/null 2>&1 || true
fi

# --- 5. smoke test --------------------------------------------------------------------------------
"$ARM/bin/arm-python" -c '
import platform, sys, numpy, tvm, tvm.rpc, cloudpickle
assert platform.machine() == "aarch64", platform.machine()
print("setup_arm.sh: arm-python", platform.machine(), "python", platform.python_version(),
      "numpy", numpy.__version__, "tvm", tvm.__version__)
' || die "the emulated python cannot import the TVM runtime"
echo "$stamp_key" >"$ARM/.stamp"
echo "setup_arm.sh: done in $(($(date +%s) - t0)) s; $(du -sh "$ARM" | cut -f1) in $ARM"
