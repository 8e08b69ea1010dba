#!/usr/bin/env bash
# The emulated Arm64 lane: runs the tests marked `arm64` under QEMU user-mode on an x86-64
# Debian 12 machine (or debian:12 container), once per emulated CPU model, with the C++
# extension cross-compiled.
#
#   bash scripts/arm64-lane.sh            # whole lane; exits non-zero on any failure
#   bash scripts/arm64-lane.sh --prepare  # only build/refresh the cache (tools, sysroot, wheels,
#                                         # extension), run no test
#
# Environment (all optional):
#   ANYCORE_ARM64_CACHE     cache dir (default ~/.cache/anycore/arm64-lane); every artefact in it
#                           is keyed by its inputs, so a second run only re-runs the tests
#   ANYCORE_ARM64_CPUS      space-separated QEMU_CPU values (default: the four below)
#   ANYCORE_ARM64_TESTS     pytest paths (default: the files under tests/ that mention arm64, and
#                           whole folders whose conftest.py does; saves emulated collection time)
#   ANYCORE_ARM64_PYTEST    extra pytest arguments (e.g. "-k platform -x")
#   ANYCORE_ARM64_TIMEOUT   seconds allowed per CPU model (default 600)
#   ANYCORE_ARM64_THREADS   torch/OpenMP threads inside each emulated run (default 1)
#   ANYCORE_ARM64_TORCH     torch version of the AArch64 wheel (default 2.9.1)
#   ANYCORE_ARM64_PYTHON    host python used for pip and helpers (default python3)
#   ANYCORE_ARM64_BINFMT    auto (default): register qemu-aarch64 in binfmt_misc when root, so
#                           tests may start aarch64 subprocesses; 0: never touch binfmt_misc
#   ANYCORE_ARM64_EXT       0: do not build the C++ extension (debugging only; said loudly, and the
#                           Arm kernels then go untested). Default: build it; a failed build fails
#                           the lane
#   ANYCORE_ARM64_DEBIAN_MIRROR, ANYCORE_ARM64_DEBIAN_SECURITY_MIRROR
#                           where the Debian 12 arm64 packages of the sysroot come from
#                           (default deb.debian.org)
#   ANYCORE_ARM64_JOBS      CPU models run in parallel (default: half the cores, at least 1)
#   ANYCORE_ARM64_ATEN_CAPABILITY  ATEN_CPU_CAPABILITY in the emulated runs (default "default";
#                           empty: let torch choose, i.e. SVE256 kernels on 256-bit SVE, ~7x slower)
#   ANYCORE_ARM64_KERNEL_RE regex naming the Arm kernel variants in tests/kernels test ids
#
# See docs/ARM64.md for what this covers and why each step is done the way it is.
set -Eeuo pipefail

PREPARE_ONLY=0
case "${1:-}" in
  "") ;;
  --prepare) PREPARE_ONLY=1 ;;
  -h | --help) sed -n '2,/^set -Eeuo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: $0 [--prepare]" >&2; exit 2 ;;
esac
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HELPERS="$REPO/scripts/arm64"
CACHE="${ANYCORE_ARM64_CACHE:-$HOME/.cache/anycore/arm64-lane}"
HOST_PY="${ANYCORE_ARM64_PYTHON:-python3}"
TORCH_VERSION="${ANYCORE_ARM64_TORCH:-2.9.1}"
TIMEOUT="${ANYCORE_ARM64_TIMEOUT:-600}"
THREADS="${ANYCORE_ARM64_THREADS:-1}"
TESTS="${ANYCORE_ARM64_TESTS:-}"
BINFMT="${ANYCORE_ARM64_BINFMT:-auto}"
DEBIAN_MIRROR="${ANYCORE_ARM64_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SECURITY_MIRROR="${ANYCORE_ARM64_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
DEBIAN_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
ATEN_CAPABILITY="${ANYCORE_ARM64_ATEN_CAPABILITY-default}"
# CPU models run side by side: half the cores (each QEMU is one busy thread), at least one.
JOBS="${ANYCORE_ARM64_JOBS:-$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))}"
KERNEL_RE="${ANYCORE_ARM64_KERNEL_RE:-neon|asimd|dotprod|sdot|i8mm|smmla|sve|aarch64|arm64}"
# `max` always with sme=off: torch's bundled Arm Compute Library picks SME2 kernels that QEMU 7.2
# cannot execute (SIGILL). sve-default-vector-length is in bytes: 16 = 128-bit, 32 = 256-bit.
DEFAULT_CPUS="max,sme=off,sve-default-vector-length=16 max,sme=off,sve-default-vector-length=32 neoverse-n1 cortex-a72"
read -r -a CPUS <<<"${ANYCORE_ARM64_CPUS:-$DEFAULT_CPUS}"

# Debian packages whose files make the AArch64 sysroot (python3.11-dev: Python.h for the
# extension build; libgomp1/libstdc++6: the extension's runtime).
SYSROOT_PACKAGES="python3.11 python3.11-dev libpython3.11 libstdc++6 libgomp1"
PIP_PLATFORMS=(--platform manylinux_2_28_aarch64 --platform manylinux_2_27_aarch64
  --platform manylinux_2_26_aarch64 --platform manylinux_2_24_aarch64
  --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64)
PIP_TARGET_ARGS=(--python-version 3.11 --implementation cp --abi cp311 --only-binary=:all:
  "${PIP_PLATFORMS[@]}" --no-compile --disable-pip-version-check --no-warn-script-location
  --progress-bar off --quiet)

LANE_START=$SECONDS
STEP="start-up"
STEP_START=$SECONDS

log() { printf '[arm64-lane] %s\n' "$*"; }
step() {
  STEP="$1"
  STEP_START=$SECONDS
  printf '\n[arm64-lane] === %s ===\n' "$STEP"
}
step_done() { log "$STEP: ${1:-done} ($((SECONDS - STEP_START)) s)"; }
die() {
  printf '\n[arm64-lane] ERROR in step "%s": %s\n' "$STEP" "$1" >&2
  [[ $# -gt 1 ]] && printf '[arm64-lane]   hint: %s\n' "$2" >&2
  exit 1
}
trap 'rc=$?; printf "\n[arm64-lane] ERROR in step \"%s\": command failed (exit %s) at line %s: %s\n" "$STEP" "$rc" "$LINENO" "$BASH_COMMAND" >&2' ERR

# sha256 of the arguments' contents (files) or literal strings; the short form keys cache dirs.
# A file is named by its path in the checkout (its basename elsewhere, e.g. in a temp folder).
key_of() {
  local item name
  for item in "$@"; do
    if [[ -f "$item" ]]; then
      name="${item#"$REPO"/}"
      [[ "$name" != /* ]] || name="$(basename "$item")"
      printf 'file %s\n' "$name"
      cat "$item"
    else
      printf 'str %s\n' "$item"
    fi
  done | sha256sum | cut -c1-16
}
# Shows the end of a pip log on failure, then fails (for `cmd || pip_failed LOG || die ...`).
pip_failed() {
  grep -v -e "^WARNING: Location 'file:" -e "as the 'root' user" "$1" | tail -n 25 >&2
  return 1
}
as_root() { if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

# ---------------------------------------------------------------------------------------------
step "host tools (qemu-user-static, aarch64 cross compiler)"
command -v "$HOST_PY" >/dev/null || die "host python '$HOST_PY' not found" "install python3 or set ANYCORE_ARM64_PYTHON"
missing=()
command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
command -v aarch64-linux-gnu-g++ >/dev/null || missing+=(g++-aarch64-linux-gnu)
command -v apt-get >/dev/null || die "apt-get not found" "this lane needs a Debian/Ubuntu host"
"$HOST_PY" -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
[[ -f "$DEBIAN_KEYRING" ]] || missing+=(debian-archive-keyring)
if ((${#missing[@]})); then
  [[ $EUID -eq 0 ]] || command -v sudo >/dev/null || die "missing ${missing[*]} and not root" \
    "run as root, or: sudo apt-get install -y ${missing[*]}"
  log "installing ${missing[*]}"
  as_root apt-get update -qq || die "apt-get update failed" "check network access to the Debian mirror"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null || die "apt-get install ${missing[*]} failed"
fi
log "$(qemu-aarch64-static --version | head -1); $(aarch64-linux-gnu-g++ --version | head -1)"
step_done

# Concurrent lanes (several people, one machine) share the cache: builds are serialised, and
# every artefact is built in a .tmp folder and renamed into place only once complete.
mkdir -p "$CACHE" || die "cannot create the cache dir $CACHE" "set ANYCORE_ARM64_CACHE"
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then
  log "another lane is building in $CACHE; waiting for its lock"
  flock 9
fi

# ---------------------------------------------------------------------------------------------
step "AArch64 sysroot (CPython 3.11 from Debian arm64 packages, private apt root)"
# Always Debian 12 (bookworm) arm64, whatever the host distribution: its python3.11 and glibc
# 2.36 match the Debian 12 cross toolchain (an Ubuntu host has neither; run there in a debian:12
# container, see docs/ARM64.md).
APT_SOURCES_TEXT="Types: deb
URIs: $DEBIAN_MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: $DEBIAN_KEYRING

Types: deb
URIs: $DEBIAN_SECURITY_MIRROR
Suites: bookworm-security
Components: main
Signed-By: $DEBIAN_KEYRING
"
SYSROOT="$CACHE/sysroot-$(key_of "sysroot-v2" "$SYSROOT_PACKAGES" "$APT_SOURCES_TEXT")"
if [[ -x "$SYSROOT/usr/bin/python3.11" ]]; then
  log "cached: $SYSROOT"
else
  APTROOT="$CACHE/aptroot"
  rm -rf "$APTROOT" "$SYSROOT.tmp"
  mkdir -p "$APTROOT"/{etc/apt/sources.list.d,etc/apt/preferences.d,etc/apt/apt.conf.d,var/lib/apt/lists/partial,var/cache/apt/archives/partial,var/lib/dpkg}
  : >"$APTROOT/var/lib/dpkg/status"
  printf '%s' "$APT_SOURCES_TEXT" >"$APTROOT/etc/apt/sources.list.d/debian-bookworm-arm64.sources"
  : >"$APTROOT/etc/apt/sources.list"
  # A private apt root: its own lists, archives and (empty) dpkg status; the host's dpkg
  # architecture list and package state are never touched.
  cat >"$APTROOT/apt.conf" <<EOF
APT::Architecture "arm64";
APT::Architectures { "arm64"; };
APT::Install-Recommends "false";
Dir::State "$APTROOT/var/lib/apt";
Dir::State::status "$APTROOT/var/lib/dpkg/status";
Dir::Cache "$APTROOT/var/cache/apt";
Dir::Etc::SourceList "$APTROOT/etc/apt/sources.list";
Dir::Etc::SourceParts "$APTROOT/etc/apt/sources.list.d";
Dir::Etc::Preferences "$APTROOT/etc/apt/preferences";
Dir::Etc::PreferencesParts "$APTROOT/etc/apt/preferences.d";
Dir::Etc::Parts "$APTROOT/etc/apt/apt.conf.d";
Debug::NoLocking "true";
EOF
  export APT_CONFIG="$APTROOT/apt.conf"
  apt-get update -qq >"$APTROOT/update.log" 2>&1 ||
    die "apt-get update (arm64 lists) failed; see $APTROOT/update.log" "the Debian mirror must be reachable"
  # shellcheck disable=SC2086
  apt-get install -y -qq --download-only $SYSROOT_PACKAGES >"$APTROOT/download.log" 2>&1 ||
    die "downloading arm64 packages ($SYSROOT_PACKAGES) failed; see $APTROOT/download.log"
  unset APT_CONFIG
  mkdir -p "$SYSROOT.tmp"
  n=0
  for deb in "$APTROOT"/var/cache/apt/archives/*.deb; do
    dpkg-deb -x "$deb" "$SYSROOT.tmp" || die "dpkg-deb -x $deb failed"
    n=$((n + 1))
  done
  [[ -x "$SYSROOT.tmp/usr/bin/python3.11" ]] || die "sysroot has no usr/bin/python3.11 after unpacking $n packages"
  mv "$SYSROOT.tmp" "$SYSROOT"
  rm -rf "$APTROOT"
  log "unpacked $n packages into $SYSROOT ($(du -sh "$SYSROOT" | cut -f1))"
fi
export QEMU_LD_PREFIX="$SYSROOT"
GUEST_PY_VERSION="$(QEMU_CPU=cortex-a72 qemu-aarch64-static "$SYSROOT/usr/bin/python3.11" -c 'import platform,sys; print(platform.machine(), sys.version.split()[0])')" ||
  die "the AArch64 python does not start under qemu-aarch64-static" "remove $SYSROOT and rerun"
log "guest python: $GUEST_PY_VERSION"
step_done

# ---------------------------------------------------------------------------------------------
step "AArch64 wheels (torch==$TORCH_VERSION + project dependencies, host pip --platform)"
PIP_EXTRA=()
"$HOST_PY" -m pip install --help 2>/dev/null | grep -q -- --break-system-packages && PIP_EXTRA+=(--break-system-packages)
# Keyed by the requirement lists derived from pyproject.toml, not the whole file: an edit
# elsewhere in it (tool settings) keeps the cached wheels.
REQS="$(mktemp -d)"
"$HOST_PY" "$HELPERS/requirements.py" lists "$REPO/pyproject.toml" "$TORCH_VERSION" "$REQS" ||
  die "could not derive requirements from pyproject.toml"
WHEELS="$CACHE/wheels-$(key_of "wheels-v3" "$REQS/nodeps.txt" "$REQS/deps.txt" "$HELPERS/requirements.py")"
if [[ -f "$WHEELS/.complete" ]]; then
  log "cached: $WHEELS"
else
  rm -rf "$WHEELS.tmp"
  mkdir -p "$WHEELS.tmp"
  mv "$REQS" "$WHEELS.tmp/.reqs"
  log "no-deps: $(tr '\n' ' ' <"$WHEELS.tmp/.reqs/nodeps.txt")"
  PIP_LOG="$WHEELS.tmp/.reqs/pip.log"
  "$HOST_PY" -m pip install "${PIP_EXTRA[@]}" --target "$WHEELS.tmp" "${PIP_TARGET_ARGS[@]}" --no-deps \
    -r "$WHEELS.tmp/.reqs/nodeps.txt" >>"$PIP_LOG" 2>&1 || pip_failed "$PIP_LOG" || die "pip could not install the aarch64 wheels of: $(tr '\n' ' ' <"$WHEELS.tmp/.reqs/nodeps.txt")" \
    "is torch==$TORCH_VERSION published for manylinux aarch64 / cp311? set ANYCORE_ARM64_TORCH"
  # shellcheck disable=SC2046
  "$HOST_PY" "$HELPERS/requirements.py" torchdeps "$WHEELS.tmp" $(sed 's/[<>=!~;[ ].*//' "$WHEELS.tmp/.reqs/nodeps.txt") \
    >>"$WHEELS.tmp/.reqs/deps.txt" || die "could not read the dependencies of the no-deps wheels"
  log "with deps: $(tr '\n' ' ' <"$WHEELS.tmp/.reqs/deps.txt")"
  "$HOST_PY" -m pip install "${PIP_EXTRA[@]}" --target "$WHEELS.tmp" "${PIP_TARGET_ARGS[@]}" \
    -r "$WHEELS.tmp/.reqs/deps.txt" >>"$PIP_LOG" 2>&1 || pip_failed "$PIP_LOG" || die "pip could not resolve/install the aarch64 wheels in $WHEELS.tmp/.reqs/deps.txt" \
    "a dependency without a manylinux aarch64 / pure-python wheel needs a pin or an entry in SKIP (scripts/arm64/requirements.py)"
  # Byte-compile on the host (same .pyc format for every 3.11.x): saves minutes of emulated
  # compilation on the first run of every CPU model.
  if "$HOST_PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    # -s/-p: the .pyc files name the final folder, so tracebacks can show library source lines
    "$HOST_PY" -m compileall -q -j 1 -s "$WHEELS.tmp" -p "$WHEELS" "$WHEELS.tmp" >/dev/null 2>&1 ||
      log "warning: compileall reported errors (ignored)"
  fi
  touch "$WHEELS.tmp/.complete"
  mv "$WHEELS.tmp" "$WHEELS"
  log "installed into $WHEELS ($(du -sh "$WHEELS" | cut -f1))"
fi
rm -rf "$REQS"
log "torch $(sed -n 's/^Version: //p' "$WHEELS"/torch-*.dist-info/METADATA)"
step_done

# ---------------------------------------------------------------------------------------------
step "cross-compile the anycore C++ extension (aarch64-linux-gnu-g++)"
EXT_DIR=""
BUILD_PY="$REPO/anycore/kernels/build.py"
mapfile -t CSRC_FILES < <(cd "$REPO" && find csrc -type f \( -name '*.cpp' -o -name '*.cc' -o -name '*.h' -o -name '*.hpp' -o -name '*.txt' \) 2>/dev/null | LC_ALL=C sort)
EXT_NOTE=""
if ! printf '%s\n' "${CSRC_FILES[@]}" | grep -qE '\.(cpp|cc)$'; then
  log "no C++ sources under csrc/ yet: nothing to build, tests use the torch-native ops"
  step_done "skipped"
elif [[ "${ANYCORE_ARM64_EXT:-1}" == 0 ]]; then
  EXT_NOTE="WITHOUT the C++ extension (ANYCORE_ARM64_EXT=0): Arm kernels NOT tested"
  log "WARNING: $EXT_NOTE"
  step_done "SKIPPED BY REQUEST"
else
  if [[ ! -f "$BUILD_PY" ]] || ! grep -q -- '--cross' "$BUILD_PY"; then
    die "csrc/ has C++ sources but anycore/kernels/build.py offers no --cross entry point" \
      "the lane cross-compiles through 'python -m anycore.kernels.build --cross aarch64 ...'"
  fi
  # The checkout path is part of the key: anycore.kernels.build hashes absolute source paths.
  EXT_KEY="$(key_of "ext-v1" "$REPO" "$WHEELS" "$(aarch64-linux-gnu-g++ --version | head -1)" "$BUILD_PY" \
    "$REPO/anycore/platform/selection.py" "${CSRC_FILES[@]/#/$REPO/}")"
  EXT_DIR="$CACHE/ext-$EXT_KEY"
  if [[ -f "$EXT_DIR/.complete" ]]; then
    log "cached: $EXT_DIR"
  else
    rm -rf "$EXT_DIR.tmp"
    mkdir -p "$EXT_DIR.tmp"
    rc=0
    (cd "$REPO" && "$HOST_PY" -m anycore.kernels.build --cross aarch64 --torch-dir "$WHEELS/torch" \
      --cxx aarch64-linux-gnu-g++ --cxx11-abi 1 --out "$EXT_DIR.tmp") >"$EXT_DIR.tmp/build.log" 2>&1 || rc=$?
    cat "$EXT_DIR.tmp/build.log"
    if [[ $rc -ne 0 ]] || ! find "$EXT_DIR.tmp" -name '*.so' | grep -q .; then
      die "the aarch64 build of the C++ extension FAILED (exit $rc); log: $EXT_DIR.tmp/build.log" \
        "a compiler error in csrc/common or csrc/generic usually means an x86-only header or intrinsic outside csrc/x86; an ImportError means the anycore package itself does not import"
    fi
    touch "$EXT_DIR.tmp/.complete"
    rm -rf "$EXT_DIR"
    mv "$EXT_DIR.tmp" "$EXT_DIR"
  fi
  log "extension: $(cd "$EXT_DIR" && find . -name '*.so' | tr '\n' ' ')"
  step_done
fi

# ---------------------------------------------------------------------------------------------
step "binfmt_misc (aarch64 subprocesses)"
if [[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]; then
  step_done "already registered"
elif [[ "$BINFMT" == 0 ]]; then
  step_done "skipped (ANYCORE_ARM64_BINFMT=0): tests that start aarch64 subprocesses will fail"
elif [[ $EUID -ne 0 ]]; then
  step_done "skipped (not root): tests that start aarch64 subprocesses will fail"
else
  [[ -e /proc/sys/fs/binfmt_misc/register ]] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
  conf=/usr/lib/binfmt.d/qemu-aarch64.conf
  if [[ -w /proc/sys/fs/binfmt_misc/register && -f "$conf" ]] && grep -v '^#' "$conf" >/proc/sys/fs/binfmt_misc/register 2>/dev/null; then
    step_done "registered from $conf"
  else
    step_done "could not register (no binfmt_misc here): tests that start aarch64 subprocesses will fail"
  fi
fi

# ---------------------------------------------------------------------------------------------
# Expected features per CPU model (names as in /proc/cpuinfo; what anycore.platform reports)
# and the SVE vector length in bits (0: no SVE).
expect_for() {
  case "$1" in
    max*sve-default-vector-length=16*) echo "asimd,asimddp,i8mm,bf16,sve,sve2,svebf16 128" ;;
    max*sve-default-vector-length=32*) echo "asimd,asimddp,i8mm,bf16,sve,sve2,svebf16 256" ;;
    max*sve-default-vector-length=64*) echo "asimd,asimddp,i8mm,bf16,sve,sve2,svebf16 512" ;;
    max*) echo "asimd,asimddp,i8mm,bf16,sve,sve2,svebf16 512" ;;
    neoverse-n1*) echo "asimd,asimddp 0" ;;
    a64fx*) echo "asimd,sve 512" ;;
    cortex-a72* | cortex-a57* | cortex-a53*) echo "asimd 0" ;;
    *) echo "" ;;
  esac
}

# Artefacts of older inputs: keep the few newest of each kind (another checkout, e.g. a git
# worktree, may still use one), drop the rest.
prune() {
  local keep=$1 pattern=$2 current=$3
  touch "$current"
  find "$CACHE" -mindepth 1 -maxdepth 1 -type d -name "$pattern" ! -name '*.tmp' -printf '%T@ %p\n' |
    sort -rn | tail -n +"$((keep + 1))" | cut -d' ' -f2- | xargs -r rm -rf
}
prune 2 'sysroot-*' "$SYSROOT"
prune 2 'wheels-*' "$WHEELS"
[[ -z "$EXT_DIR" ]] || prune 4 'ext-*' "$EXT_DIR"
flock -u 9
if ((PREPARE_ONLY)); then
  log "cache ready in $CACHE ($((SECONDS - LANE_START)) s); no tests run (--prepare)"
  exit 0
fi
RUN_DIR="$CACHE/runs/$(date +%Y%m%d-%H%M%S)-$$"
mkdir -p "$RUN_DIR"
# keep the 5 newest runs
find "$CACHE/runs" -mindepth 1 -maxdepth 1 -type d | LC_ALL=C sort | head -n -5 | xargs -r rm -rf
PYPATH="$REPO:$WHEELS"
# With no extension, say so: otherwise the loader would try to compile one under emulation.
# tests/arm64/test_lane_extension_arm64.py checks that the cross-built one loads as is.
if [[ -n "$EXT_DIR" ]]; then EXT_ENV=(ANYCORE_EXT_DIR="$EXT_DIR"); else EXT_ENV=(ANYCORE_NO_EXT=1); fi
# torch picks its SVE256 kernels on a 256-bit SVE CPU; QEMU runs those about 7x slower than its
# default ones, for nothing the lane tests (anycore's own SVE variant still sees 256 bits).
ATEN_ENV=()
[[ -z "$ATEN_CAPABILITY" ]] || ATEN_ENV=(ATEN_CPU_CAPABILITY="$ATEN_CAPABILITY")
if [[ -n "$TESTS" ]]; then
  read -r -a TEST_PATHS <<<"$TESTS"
else
  # Only modules that can hold arm64-marked tests are imported (collection under emulation costs
  # seconds per module): files naming the marker, and folders whose conftest.py names it.
  mapfile -t TEST_PATHS < <(cd "$REPO" && {
    grep -rlw --include=conftest.py arm64 tests | xargs -r -n1 dirname | sed 's|$|/|' || true
    grep -rlw --include='test_*.py' --include='*_test.py' arm64 tests || true
  } | LC_ALL=C sort | awk '{ for (d in dirs) if (index($0, d) == 1) next; if ($0 ~ /\/$/) dirs[$0]; print }')
  ((${#TEST_PATHS[@]})) || die "no test file under tests/ mentions the arm64 marker"
fi
SHARED_DIR="$RUN_DIR/shared"
mkdir -p "$SHARED_DIR"
read -r -a PYTEST_EXTRA <<<"${ANYCORE_ARM64_PYTEST:-}"

# One pytest run under one emulated CPU model: RUN_DIR/<slug>.{log,xml,rc,seconds}.
run_cpu() {
  local cpu=$1 slug=$2 features sve_bits rc=0 t0=$SECONDS
  read -r features sve_bits <<<"$(expect_for "$cpu")"
  cd "$REPO"
  env -u PYTHONHOME QEMU_LD_PREFIX="$SYSROOT" QEMU_CPU="$cpu" PYTHONPATH="$PYPATH" \
    PYTHONNOUSERSITE=1 OMP_NUM_THREADS="$THREADS" ANYCORE_NUM_THREADS="$THREADS" \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    "${EXT_ENV[@]}" "${ATEN_ENV[@]}" ANYCORE_ARM64_LANE=1 ANYCORE_TEST_SHARED_DIR="$SHARED_DIR" ANYCORE_EXPECT_CPU="$cpu" \
    ANYCORE_EXPECT_FEATURES="$features" ANYCORE_EXPECT_SVE_BITS="$sve_bits" \
    timeout --kill-after=30 "$TIMEOUT" qemu-aarch64-static "$SYSROOT/usr/bin/python3.11" -m pytest \
    -m arm64 -p no:cacheprovider -q -rfE --junitxml="$RUN_DIR/$slug.xml" \
    "${PYTEST_EXTRA[@]}" "${TEST_PATHS[@]}" || rc=$?
  echo "$rc" >"$RUN_DIR/$slug.rc"
  echo "$((SECONDS - t0))" >"$RUN_DIR/$slug.seconds"
}

RESULTS=()
slugs=()
for cpu in "${CPUS[@]}"; do slugs+=("$(echo "$cpu" | tr -c 'A-Za-z0-9\n' '_')"); done
if [[ $JOBS -le 1 ]]; then
  for i in "${!CPUS[@]}"; do
    step "pytest -m arm64 under QEMU_CPU=${CPUS[$i]}"
    (run_cpu "${CPUS[$i]}" "${slugs[$i]}") 2>&1 | tee "$RUN_DIR/${slugs[$i]}.log"
    step_done "exit $(cat "$RUN_DIR/${slugs[$i]}.rc" 2>/dev/null || echo '?')"
  done
else
  step "pytest -m arm64 under ${#CPUS[@]} CPU models, $JOBS at a time"
  for i in "${!CPUS[@]}"; do
    while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do wait -n || true; done
    (run_cpu "${CPUS[$i]}" "${slugs[$i]}") >"$RUN_DIR/${slugs[$i]}.log" 2>&1 &
  done
  wait || true
  for i in "${!CPUS[@]}"; do
    printf '\n[arm64-lane] --- QEMU_CPU=%s (exit %s) ---\n' "${CPUS[$i]}" "$(cat "$RUN_DIR/${slugs[$i]}.rc" 2>/dev/null || echo '?')"
    cat "$RUN_DIR/${slugs[$i]}.log"
  done
  step_done
fi
for i in "${!CPUS[@]}"; do
  RESULTS+=("${CPUS[$i]}|$RUN_DIR/${slugs[$i]}.xml|$(cat "$RUN_DIR/${slugs[$i]}.rc" 2>/dev/null || echo 255)|$(cat "$RUN_DIR/${slugs[$i]}.seconds" 2>/dev/null || echo 0)")
done

# ---------------------------------------------------------------------------------------------
STEP="summary"
printf '\n[arm64-lane] === summary (logs and junit xml: %s) ===\n' "$RUN_DIR"
rc=0
SUMMARY_ARGS=()
[[ -n "$EXT_DIR" ]] && SUMMARY_ARGS+=(--require-kernel-tests)
"$HOST_PY" "$HELPERS/summarize.py" "${SUMMARY_ARGS[@]}" "$KERNEL_RE" "${RESULTS[@]}" || rc=$?
log "lane wall time: $((SECONDS - LANE_START)) s"
if [[ $rc -ne 0 ]]; then
  printf '[arm64-lane] FAILED: see the table above and %s/*.log\n' "$RUN_DIR" >&2
  exit 1
fi
if [[ -n "$EXT_NOTE" ]]; then log "PASSED, but $EXT_NOTE"; else log "PASSED"; fi
