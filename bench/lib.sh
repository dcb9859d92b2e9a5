# shellcheck shell=bash
# shellcheck disable=SC2034,SC2094  # globals read by the scripts that source this
# Shared by bench/first-run and bench/compare: start and stop the processes
# under test on loopback, run wrk, and read CPU time from /proc.
# Sourced, not run. Every process started here is recorded and stopped by
# bench_cleanup (installed as an EXIT/INT/TERM trap by bench_init).

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$BENCH_DIR/.." && pwd)
BUILD_DIR=${SLUICE_BUILD:-$REPO_DIR/build}
WRK_DIR=$BENCH_DIR/wrk
CLK_TCK=$(getconf CLK_TCK)

BENCH_PIDS=()      # every process we started, stopped in reverse order
declare -A BENCH_NAMES=()   # pid -> the name start_bg gave it (its log's name)
BENCH_PORTS=()     # ports handed out by free_port in this run
BENCH_TMP=""
BENCH_KEEP_TMP=0

log() { printf '%s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

bench_init() {
    BENCH_TMP=$(mktemp -d "${TMPDIR:-/tmp}/sluice-bench.XXXXXX")
    trap bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    # nginx/HAProxy and wrk each hold one descriptor per connection.
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
}

bench_cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    local i pid
    for ((i = ${#BENCH_PIDS[@]} - 1; i >= 0; i--)); do
        pid=${BENCH_PIDS[i]}
        kill -TERM "$pid" 2>/dev/null || continue
    done
    for pid in "${BENCH_PIDS[@]}"; do
        # Give each a moment to drain, then make sure it is gone.
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    BENCH_PIDS=()
    if [[ -n $BENCH_TMP && -d $BENCH_TMP ]]; then
        if ((BENCH_KEEP_TMP)); then log "logs and configs kept in $BENCH_TMP"
        else rm -rf "$BENCH_TMP"; fi
    fi
    exit "$rc"
}

# Stop one process we started (TERM, then KILL after 3 s) and forget it.
# A process that dies of another signal (a crash while draining) is named.
stop_pid() {
    local pid=$1 keep=() p rc=0 killed=1
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || { killed=0; break; }; sleep 0.1; done
    if ((killed)); then kill -KILL "$pid" 2>/dev/null || true; fi
    wait "$pid" 2>/dev/null || rc=$?
    if ((killed)); then
        log "warning: ${BENCH_NAMES[$pid]:-process $pid} did not stop within 3 s of SIGTERM: killed"
    elif ((rc > 128 && rc != 128 + 15)); then
        log "warning: ${BENCH_NAMES[$pid]:-process $pid} died of signal $((rc - 128)) when stopped (log: $BENCH_TMP/${BENCH_NAMES[$pid]:-}.log)"
    fi
    for p in "${BENCH_PIDS[@]}"; do [[ $p == "$pid" ]] || keep+=("$p"); done
    BENCH_PIDS=("${keep[@]}")
}

# free_port VAR: set VAR to a loopback TCP port nobody uses (and that this
# run has not handed out). Sets a variable rather than printing: a $(...)
# subshell would lose the record of ports handed out.
free_port() {
    # Locals are prefixed: printf -v must not land on one of them.
    local _fp_port _fp_used
    for _ in $(seq 200); do
        _fp_port=$((20000 + RANDOM % 40000))
        for _fp_used in "${BENCH_PORTS[@]}"; do [[ $_fp_used == "$_fp_port" ]] && continue 2; done
        if [[ -z $(ss -Htan "sport = :$_fp_port" 2>/dev/null) ]]; then
            BENCH_PORTS+=("$_fp_port")
            printf -v "$1" '%s' "$_fp_port"
            return 0
        fi
    done
    die "no free port found"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_ready PID PORT LOGFILE [SECONDS]: wait until PORT accepts connections;
# fail if PID exits first.
wait_ready() {
    local pid=$1 port=$2 logf=$3 secs=${4:-10} i
    for ((i = 0; i < secs * 20; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "process $pid exited while starting; last lines of $logf:"
            tail -n 5 "$logf" >&2 2>/dev/null
            return 1
        fi
        port_open "$port" && return 0
        sleep 0.05
    done
    log "port $port not open after ${secs}s; last lines of $logf:"
    tail -n 5 "$logf" >&2 2>/dev/null
    return 1
}

# start_bg NAME PORT CMD...: start CMD in the background, logging to
# $BENCH_TMP/NAME.log, wait for PORT; sets STARTED_PID. Call it (and the
# start_* functions) directly, never in $(...): the process must be a child
# of this shell so that cleanup can stop and reap it.
start_bg() {
    local name=$1 port=$2; shift 2
    local logf=$BENCH_TMP/$name.log
    "$@" >"$logf" 2>&1 &
    local pid=$!
    BENCH_PIDS+=("$pid")
    BENCH_NAMES[$pid]=$name
    echo "\$ $*" >>"$BENCH_TMP/commands.txt"
    if ! wait_ready "$pid" "$port" "$logf" "${START_TIMEOUT_S:-10}"; then
        stop_pid "$pid"
        return 1
    fi
    STARTED_PID=$pid
}

# built NAME: the path of a built program: $BUILD_DIR/NAME, or where meson
# puts a program defined in a subfolder (tools/NAME/NAME).
built() {
    local c
    for c in "$BUILD_DIR/$1" "$BUILD_DIR/tools/$1/$1" "$BUILD_DIR/src/$1"; do
        [[ -x $c && -f $c ]] && { echo "$c"; return 0; }
    done
    return 1
}

need_built() {
    local b
    for b in "$@"; do
        built "$b" >/dev/null || die "$b not found in $BUILD_DIR: build first with
    meson setup build && meson compile -C build
(or set SLUICE_BUILD to another build folder)"
    done
}

# --- tools --------------------------------------------------------------------

# bench_install CMD...: install the Debian packages of the commands missing
# (apt-get, as root; the packages' own nginx/HAProxy services are kept from
# starting). BENCH_INSTALL=0: fail instead. BENCH_DEBS=DIR: install the .deb
# files in DIR with dpkg first (a machine with no registry: fetch them
# elsewhere with `apt-get download`, see README.md).
bench_install() {
    local -A pkg_of=([nginx]=nginx [haproxy]=haproxy [wrk]=wrk [h2load]=nghttp2-client
                     [taskset]=util-linux [curl]=curl [ss]=iproute2 [pgrep]=procps
                     [node]=nodejs [lscpu]=util-linux [redis-server]=redis-server)
    local missing=() c
    for c in "$@"; do
        command -v "$c" >/dev/null || missing+=("${pkg_of[$c]:-$c}")
    done
    ((${#missing[@]})) || return 0
    ((${BENCH_INSTALL:-1})) || die "missing: ${missing[*]} (run without --no-install, or apt-get install them)"
    [[ $(id -u) == 0 ]] || die "missing: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}"
    log "installing: ${missing[*]}"
    # Keep the packages' own nginx/HAProxy services from starting (they
    # would listen on all interfaces and outlive this script).
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
    fi
    local rc=0
    if [[ -n ${BENCH_DEBS:-} ]]; then
        compgen -G "$BENCH_DEBS/*.deb" >/dev/null || die "no .deb files in $BENCH_DEBS"
        DEBIAN_FRONTEND=noninteractive dpkg -i "$BENCH_DEBS"/*.deb >&2 || rc=$?
    else
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends "${missing[@]}"; } >&2 || rc=$?
    fi
    ((made_policy)) && rm -f "$policy"
    ((rc == 0)) || die "installing ${missing[*]} failed"
    for c in "$@"; do command -v "$c" >/dev/null || die "$c is still missing after the install"; done
}

# --- the processes under test -------------------------------------------------

# start_mock PORT THREADS PIN... -- MOCK_ARGS...
start_mock() {
    local port=$1 threads=$2; shift 2
    local pin=()
    while [[ $1 != -- ]]; do pin+=("$1"); shift; done
    shift
    start_bg "mock-vllm-$port" "$port" "${pin[@]}" "$(built mock-vllm)" \
        --port "$port" --threads "$threads" --created 1700000000 --no-record "$@"
}

# start_mock_triton PORT PIN... -- MOCK_ARGS...: mock-triton (one thread; it
# takes mock-vllm's --reply-tokens, --tokens-per-sec, --token-pad, --ttft-ms
# and makes the same tokens: "tok<i>", a space before each but the first).
start_mock_triton() {
    local port=$1; shift
    local pin=()
    while [[ $1 != -- ]]; do pin+=("$1"); shift; done
    shift
    start_bg "mock-triton-$port" "$port" "${pin[@]}" "$(built mock-triton)" \
        --port "$port" --created 1700000000 "$@"
}

# start_sluice NAME PORT BACKEND_PORT CONFIG CPUS PIN...
# CONFIG may be empty (embedded default), CPUS may be empty (affinity mask).
# BACKEND_SCHEME: the backend URL's scheme (default http; grpc for a
# protocol = "triton" group). Sets STARTED_PID and STARTED_ADMIN (its admin
# port).
start_sluice() {
    local name=$1 port=$2 backend=$3 config=$4 cpus=$5; shift 5
    local admin args=()
    free_port admin
    args=(--listen "127.0.0.1:$port" --admin "127.0.0.1:$admin"
          --backend "${BACKEND_SCHEME:-http}://127.0.0.1:$backend")
    [[ -n $config ]] && args+=(--config "$config")
    [[ -n $cpus ]] && args+=(--cpus "$cpus")
    local bin=${SLUICE_BIN:-}
    [[ -n $bin ]] || bin=$(built sluice) || { log "sluice is not built in $BUILD_DIR"; return 1; }
    START_TIMEOUT_S=5 start_bg "$name" "$port" "$@" "$bin" "${args[@]}" || return 1
    STARTED_ADMIN=$admin
}

# write_sluice_config FILE BACKEND_PORT [EXTRA]: the embedded default's
# settings (one group for any model, key test-key) with the audit log kept
# in the temp dir. EXTRA (TOML) goes first in [server]: more [server] keys,
# then other tables.
# LEAN=1: audit off and no usage injection (what the features cost).
# AUDIT_EXTRA (TOML): more [audit] keys, e.g. fsync_interval_ms = 86400000.
# KEY_EXTRA (TOML): more keys of the bench key, e.g. tokens_per_minute.
# PROTOCOL=anthropic|triton: the group's protocol (default openai); triton
# takes a grpc:// backend.
write_sluice_config() {
    local file=$1 backend=$2 extra=${3:-}
    local audit_path="$BENCH_TMP/$(basename "$file" .toml)-audit.jsonl" inject=true
    local protocol=${PROTOCOL:-openai} scheme=http
    [[ $protocol == triton ]] && scheme=grpc
    if [[ ${LEAN:-0} == 1 ]]; then audit_path="" inject=false; fi
    cat >"$file" <<EOF
[server]
$extra

[audit]
path = "$audit_path"
${AUDIT_EXTRA:-}

[[group]]
name = "default"
models = ["*"]
protocol = "$protocol"
backends = ["$scheme://127.0.0.1:$backend"]
inject_usage = $inject
${GROUP_EXTRA:-}

[[key]]
id = "bench"
key = "test-key"
${KEY_EXTRA:-}
EOF
}

# auto_router_toml MOCK_PORT: sluice-auto's router: the load's model name is
# the auto model, classified over tests/data/router's four groups.
# ROUTER_EXTRA (TOML): more [router] keys, e.g. "token_cache = 0" (every
# token's rows read from the model, as for a prompt of words not seen yet).
auto_router_toml() {
    local data=$REPO_DIR/tests/data/router g
    printf '\n[router]\nauto_model = "mock-model"\nsemantic = "classifier"\ndefault_group = "chat"\n%s\n' \
        "${ROUTER_EXTRA:-}"
    for g in code math translation chat; do
        printf '\n[[group]]\nname = "%s"\nbackends = ["http://127.0.0.1:%s"]\nexamples_file = "%s/%s.txt"\n' \
            "$g" "$1" "$data" "$g"
    done
}

# start_relay PORT BACKEND_PORT THREADS PIN...: bench-relay (bench/relay),
# the plain L4 relay on io_uring that parses nothing: the floor.
start_relay() {
    local port=$1 backend=$2 threads=$3; shift 3
    local bin
    bin=$(built bench-relay) || { log "bench-relay is not built in $BUILD_DIR"; return 1; }
    start_bg "relay-$port" "$port" "$@" "$bin" --listen "$port" --backend "127.0.0.1:$backend" --threads "$threads"
}

# start_redis PORT PIN...: a redis-server for [cluster] (no persistence);
# sets STARTED_PID.
start_redis() {
    local port=$1; shift
    start_bg "redis-$port" "$port" "$@" redis-server --port "$port" --bind 127.0.0.1 --save "" \
        --appendonly no --daemonize no
}

# start_nginx PORT BACKEND_PORT WORKERS PIN...
# NGINX_MAIN_EXTRA: a line for the main context (bench/scale binds each
# worker to its own CPU with "worker_cpu_affinity auto;").
# PROXY_TLS_PORT, PROXY_H2C_PORT, TLS_CERT, TLS_KEY (bench/compare's TLS
# workloads): a second server with the same location: TLS (ALPN h2,
# http/1.1) on PROXY_TLS_PORT, HTTP/2 with prior knowledge on
# PROXY_H2C_PORT; TLS 1.3 suites TLS_CIPHERSUITES (default
# TLS_AES_128_GCM_SHA256).
start_nginx() {
    local port=$1 backend=$2 workers=$3; shift 3
    local dir=$BENCH_TMP/nginx-$port
    mkdir -p "$dir"
    local location='location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 120s;
        }' tls_server=""
    if [[ -n ${PROXY_TLS_PORT:-} ]]; then
        # nginx 1.25.1 moved http2 from the listen line to its own directive.
        local h2_listen=" http2" h2_on=""
        if [[ $(printf '%s\n' 1.25.1 "$(nginx -v 2>&1 | sed 's|.*/||')" | sort -V | head -n1) == 1.25.1 ]]; then
            h2_listen="" h2_on="http2 on;"
        fi
        tls_server="server {
        listen 127.0.0.1:$PROXY_TLS_PORT ssl$h2_listen;
        listen 127.0.0.1:$PROXY_H2C_PORT$h2_listen;
        $h2_on
        ssl_certificate $TLS_CERT;
        ssl_certificate_key $TLS_KEY;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_conf_command Ciphersuites ${TLS_CIPHERSUITES:-TLS_AES_128_GCM_SHA256};
        $location
    }"
    fi
    local user_line="" nofile
    nofile=$(ulimit -n)
    [[ $(id -u) == 0 ]] && user_line="user root;"
    # A proxied stream is two connections (client and upstream), both counted
    # in worker_connections. Once fewer than 1/16 of them are free, nginx
    # closes the connections it deems reusable, among them new ones still
    # waiting for their request: 1/8 above the descriptor limit, which stays
    # the real cap, keeps that from happening below it.
    NGINX_WORKER_CONNECTIONS=$((nofile * 9 / 8))
    cat >"$dir/nginx.conf" <<EOF
# Written by bench: a plain keep-alive reverse proxy, as commonly put in
# front of vLLM, with SSE unbuffered.
$user_line
worker_processes $workers;
${NGINX_MAIN_EXTRA:-}
worker_rlimit_nofile $nofile;
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events {
    worker_connections $NGINX_WORKER_CONNECTIONS;
}
http {
    access_log off;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 60s;
    upstream backend {
        server 127.0.0.1:$backend;
        keepalive 64;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$port;
        $location
    }
    $tls_server
}
EOF
    start_bg "nginx-$port" "$port" "$@" nginx -p "$dir/" -e "$dir/error.log" -c "$dir/nginx.conf"
}

# start_haproxy PORT BACKEND_PORT THREADS PIN...
# HAPROXY_DEFAULTS_EXTRA: a line for its defaults section (bench/compare's
# (c) sets "option http-no-delay").
# PROXY_TLS_PORT, PROXY_H2C_PORT, TLS_PEM (cert and key in one file): as
# start_nginx's.
start_haproxy() {
    local port=$1 backend=$2 threads=$3; shift 3
    local dir=$BENCH_TMP/haproxy-$port
    mkdir -p "$dir"
    local tls_binds=""
    [[ -n ${PROXY_TLS_PORT:-} ]] && tls_binds="bind 127.0.0.1:$PROXY_TLS_PORT ssl crt $TLS_PEM alpn h2,http/1.1 ssl-min-ver TLSv1.2 ciphersuites ${TLS_CIPHERSUITES:-TLS_AES_128_GCM_SHA256}
    bind 127.0.0.1:$PROXY_H2C_PORT proto h2"
    # HAProxy refuses to start if maxconn needs more descriptors than the
    # limit allows: two per proxied connection, and a few of its own (2.6:
    # maxconn 9990 is the most a limit of 20,000 allows). Workload (f) holds
    # that many streams open, hence so close to the limit.
    local maxconn=$(( ($(ulimit -n) - 32) / 2 ))
    HAPROXY_MAXCONN=$maxconn
    cat >"$dir/haproxy.cfg" <<EOF
# Written by bench: HTTP mode with server-side connection reuse.
global
    nbthread $threads
    maxconn $maxconn
defaults
    mode http
    option http-keep-alive
    http-reuse always
    ${HAPROXY_DEFAULTS_EXTRA:-}
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    timeout http-keep-alive 60s
frontend fe
    bind 127.0.0.1:$port
    $tls_binds
    default_backend be
backend be
    server mock 127.0.0.1:$backend
EOF
    start_bg "haproxy-$port" "$port" "$@" haproxy -db -f "$dir/haproxy.cfg"
}

# --- measuring ----------------------------------------------------------------

# CPU ticks (user+system, all threads) of PID and its direct children
# (nginx's workers); 0 if gone.
proc_ticks() {
    local pid total=0 stat rest f
    for pid in "$1" $(pgrep -P "$1" 2>/dev/null); do
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
        rest=${stat##*) }          # fields from 3 (state) on
        read -r -a f <<<"$rest"
        total=$((total + f[11] + f[12]))   # utime (14), stime (15)
    done
    echo "$total"
}

# proc_ticks_split PID: as proc_ticks, into PROC_TICKS (user+system) and
# PROC_USER_TICKS (user only), without a subshell.
proc_ticks_split() {
    local pid stat rest f
    PROC_TICKS=0 PROC_USER_TICKS=0
    for pid in "$1" $(pgrep -P "$1" 2>/dev/null); do
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
        rest=${stat##*) }
        read -r -a f <<<"$rest"
        PROC_TICKS=$((PROC_TICKS + f[11] + f[12]))
        PROC_USER_TICKS=$((PROC_USER_TICKS + f[11]))
    done
}

# proc_cpu_ns PID: CPU time (user+system) in ns of PID's threads and its
# direct children's, from /proc/PID/task/*/schedstat: nanoseconds where
# /proc/PID/stat counts 10 ms ticks, precise enough for a light load
# measured over a few seconds. Threads that exited are not counted.
proc_cpu_ns() {
    local pid sum=0 f v
    for pid in "$1" $(pgrep -P "$1" 2>/dev/null); do
        for f in /proc/"$pid"/task/*/schedstat; do
            read -r v _ 2>/dev/null <"$f" || continue
            sum=$((sum + v))
        done
    done
    echo "$sum"
}

# proc_pids PID: PID and its direct children (nginx's workers), comma-separated.
proc_pids() {
    local list=$1 c
    for c in $(pgrep -P "$1" 2>/dev/null); do list+=",$c"; done
    echo "$list"
}

# Busy ticks of one CPU (user+nice+system+irq+softirq) or of all when no arg.
cpu_busy_ticks() {
    local name=${1:+cpu$1}
    awk -v n="${name:-cpu}" '$1 == n { print $2 + $3 + $4 + $7 + $8; exit }' /proc/stat
}

# children_ticks VAR: set VAR to the CPU ticks this shell's reaped children
# used (wrk, curl), from `times`. `times` must run in this shell (a $(...)
# subshell reports its own, empty, children), so its output goes via a file.
children_ticks() {
    times >"$BENCH_TMP/times"
    local _ct_ticks
    _ct_ticks=$(awk -v hz="$CLK_TCK" 'END {
        s = 0
        for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] }
        printf "%d", s * hz + 0.5 }' "$BENCH_TMP/times")
    printf -v "$1" '%s' "$_ct_ticks"
}

# run_wrk OUTFILE PIN... -- WRK_ARGS...: run wrk, keep its full output in
# OUTFILE, print its WRK_RESULT line (empty if wrk failed).
run_wrk() {
    local out=$1; shift
    local pin=()
    while [[ $1 != -- ]]; do pin+=("$1"); shift; done
    shift
    echo "\$ ${pin[*]:+${pin[*]} }wrk $*" >>"$BENCH_TMP/commands.txt"
    "${pin[@]}" wrk "$@" >"$out" 2>&1 || true
    grep -m1 '^WRK_RESULT ' "$out" || true
}

# field LINE KEY: a value from a WRK_RESULT line.
field() { sed -n "s/.* $2=\([0-9-]*\).*/\1/p" <<<"$1"; }

# The request bodies wrk sends, for curl checks.
chat_body() {
    local stream=$1 max_tokens=$2
    local extra=""
    [[ $stream == 1 ]] && extra=',"stream":true'
    printf '{"model":"mock-model","messages":[{"role":"user","content":"Say something."}],"max_tokens":%s%s}' \
        "$max_tokens" "$extra"
}

# fetch_body PORT STREAM MAX_TOKENS [BASE [CURL_ARGS...]]: the reply body
# with ids normalised. BASE (default http://127.0.0.1:PORT) is the URL's
# scheme and authority, e.g. https://127.0.0.1:PORT with --cacert FILE.
fetch_body() {
    local base=${4:-http://127.0.0.1:$1}
    curl -sS --max-time 20 -H 'Authorization: Bearer test-key' \
        -H 'Content-Type: application/json' \
        --data-binary "$(chat_body "$2" "$3")" "${@:5}" \
        "$base/v1/chat/completions" |
        sed -E 's/"id":"[^"]*"/"id":"X"/g; s/"created":[0-9]+/"created":0/g'
}

# probe PORT [STREAM]: HTTP status of one chat request, non-stream, or with
# STREAM=1 a streaming one given up after 1 s: its head is what counts (the
# backend of bench/compare's workload (f) sends the head, then nothing).
probe() {
    local stream=${2:-0} max_s=5
    ((stream)) && max_s=1
    curl -s -o /dev/null -w '%{http_code}' --max-time "$max_s" \
        -H 'Authorization: Bearer test-key' -H 'Content-Type: application/json' \
        --data-binary "$(chat_body "$stream" 16)" "http://127.0.0.1:$1/v1/chat/completions" || true
}

# Median of numbers on stdin (one per line, "-" lines ignored); "-" if none.
median() {
    grep -v '^-*$' | sort -g | awk '{ v[NR] = $1 } END {
        if (NR == 0) { print "-"; exit }
        if (NR % 2) m = v[(NR + 1) / 2]; else m = (v[NR / 2] + v[NR / 2 + 1]) / 2
        if (m == int(m)) printf "%d\n", m; else printf "%.1f\n", m }'
}

# ratio A B: A / B with two decimals, or "-" when either is missing.
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN {
        if (a == "" || b == "" || a == "-" || b == "-" || b + 0 == 0) print "-"
        else printf "%.2f\n", a / b }'
}
