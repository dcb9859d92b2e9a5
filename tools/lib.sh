# Shared by tools/test and tools/run (sourced, not executed).
# Installs what a fresh Debian 12 machine lacks to build and test sluice.

sluice_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Debian packages that building and running sluice and mock-vllm need
# (tools/run installs these alone) ...
sluice_run_packages=(
  build-essential g++ meson ninja-build pkg-config cmake
  liburing-dev libsimdjson-dev libmimalloc-dev libfmt-dev doctest-dev
  libtomlplusplus-dev libxxhash-dev libssl-dev openssl libnghttp2-dev node-llhttp
  libhiredis-dev libfasttext-dev libnuma-dev
  nodejs npm curl
)
# ... and what the tests add (tools/test installs both lists).
sluice_test_packages=(
  protobuf-compiler
  redis-server  # [cluster] and budgets in Redis (tests/integration/*redis*, cluster)
  wrk  # a load generator of its own in the binary-upgrade test (tests/integration/upgrade.test.mjs)
  nghttp2-client  # h2load: 100 streams on one connection (tests/integration/h2.test.mjs)
  python3
  chromium  # the status page's browser test (tests/integration/status_page_browser.test.mjs)
)
sluice_packages=("${sluice_run_packages[@]}" "${sluice_test_packages[@]}")

log() { printf '== %s\n' "$*" >&2; }

# A package counts as present when dpkg says "install ok installed". nodejs
# may come from another repository (e.g. a newer Node); any version counts,
# and npm is part of such a nodejs build, so it is only needed without one.
sluice_install_missing() {
  local missing=() pkg
  for pkg in "${sluice_packages[@]}"; do
    if [[ $pkg == npm ]] && command -v npm >/dev/null 2>&1; then continue; fi
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  log "installing missing packages: ${missing[*]}"
  local sudo=()
  if ((EUID != 0)); then sudo=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  # Callers use `|| ...`, which turns set -e off in here: check each step.
  "${sudo[@]}" apt-get update -q || return 1
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" || return 1
}

# `npm ci` in tests/integration when its node_modules is missing or older
# than the lock file.
sluice_npm_ci() {
  local dir="$sluice_root/tests/integration"
  if [[ ! -d $dir/node_modules/openai || $dir/package-lock.json -nt $dir/node_modules/.package-lock.json ]]; then
    log "npm ci in tests/integration"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) || return 1
  fi
}

# Configures (once) and compiles a build folder:
#   sluice_build DIR [meson setup args...] [-- TARGET...]
# With targets after --, only those (and what they link) are compiled.
sluice_build() {
  local dir=$1
  shift
  local setup=() targets=()
  while (($#)); do
    if [[ $1 == -- ]]; then
      shift
      targets=("$@")
      break
    fi
    setup+=("$1")
    shift
  done
  if [[ ! -f $sluice_root/$dir/build.ninja ]]; then
    log "meson setup $dir ${setup[*]}"
    meson setup "$sluice_root/$dir" "$sluice_root" ${setup[@]+"${setup[@]}"} || return 1
  fi
  log "meson compile -C $dir ${targets[*]}"
  meson compile -C "$sluice_root/$dir" ${targets[@]+"${targets[@]}"}
}
