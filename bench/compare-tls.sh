#!/usr/bin/env bash
# shellcheck disable=SC2034,SC2154  # globals of bench/compare, which sources this
# bench/compare-tls.sh: workloads (g)-(k) of bench/compare, TLS and HTTP/2
# in front of the same mock-vllm (issue 16), and their report tables.
# Sourced by bench/compare (it uses compare's globals and helpers: measure,
# guarded, start_stack, tport/tpid, BENCH_TMP); not run on its own.
#
# Every target but direct gets, besides its plaintext HTTP/1.1 listener:
#   nginx    a second server: "listen ... ssl http2" (1.25.1 on: "ssl" and
#            "http2 on") and a plaintext "listen ... http2" (prior knowledge)
#   HAProxy  "bind ... ssl crt PEM alpn h2,http/1.1" and "bind ... proto h2"
#   sluice   [server] listen_tls, tls_cert, tls_key, tls_min_version = "1.2",
#            h2c = true (h2c on its plaintext listener)
# One self-signed EC P-256 certificate per run (openssl req), the same for
# all. TLS 1.3 suite TLS_AES_128_GCM_SHA256 on every connection: pinned in
# nginx (ssl_conf_command Ciphersuites) and HAProxy (ciphersuites), and on
# the client side for all (h2load --tls13-ciphers; wrk and curl through an
# OpenSSL config, OPENSSL_CONF, that the processes of these workloads,
# sluice's included, inherit). direct is mock-vllm, plaintext HTTP/1.1 only:
# the reference of the added latency and the backend's own ceiling.
# A sluice that refuses the TLS keys (--check-config), whose TLS port does
# not answer within 5 s, or that answers a protocol with something else than
# a 200 is reported "n/a (unsupported)" for what it lacks; nginx and HAProxy
# must pass the same checks or the run stops.

TLS_SUITE=TLS_AES_128_GCM_SHA256
H2_CONNS=${H2_CONNS:-32}
H2_STREAMS=${H2_STREAMS:-8}
RESULTS_H=$BENCH_TMP/results-h.tsv   # (h), (i), (j): h2load runs
: >"$RESULTS_H"
# target -> its TLS port, its h2c port (sluice: its plaintext port), its
# [server] TOML for sluice; TARGET.PROTO -> why sluice lacks it; target ->
# what its TLS handshake gave (version, suite, ALPN)
declare -A TLS_PORT_OF=() H2C_PORT_OF=() TLS_NA=() TLS_INFO=()
TLS_DIR="" TLS_STACK_KEY=""

# tls_proto WORKLOAD: what it speaks to the proxies (empty: not a TLS one).
tls_proto() {
    case $1 in
        g|k) echo tls_h1 ;;
        h|j) echo tls_h2 ;;
        i) echo h2c ;;
    esac
}

# tls_files: the certificate, HAProxy's PEM (chain + key) and the clients'
# OpenSSL config, once per run.
tls_files() {
    [[ -n $TLS_DIR ]] && return 0
    TLS_DIR=$BENCH_TMP/tls
    mkdir -p "$TLS_DIR"
    local cmd=(openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes
               -days 2 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1
               -keyout "$TLS_DIR/key.pem" -out "$TLS_DIR/cert.pem")
    record_command "${cmd[@]}"
    "${cmd[@]}" >"$TLS_DIR/openssl.log" 2>&1 ||
        die "openssl could not make a certificate: $(tail -n 3 "$TLS_DIR/openssl.log")"
    cat "$TLS_DIR/cert.pem" "$TLS_DIR/key.pem" >"$TLS_DIR/haproxy.pem"
    cat >"$TLS_DIR/client.cnf" <<EOF
# Written by bench/compare: the TLS settings of its clients (and of the
# processes started for its TLS workloads).
openssl_conf = bench_init
[bench_init]
ssl_conf = bench_ssl
[bench_ssl]
system_default = bench_tls
[bench_tls]
MinProtocol = TLSv1.2
Ciphersuites = $TLS_SUITE
EOF
    TLS_CERT=$TLS_DIR/cert.pem TLS_KEY=$TLS_DIR/key.pem TLS_PEM=$TLS_DIR/haproxy.pem
}

sluice_tls_toml() {
    printf 'listen_tls = "127.0.0.1:%s"\ntls_cert = "%s"\ntls_key = "%s"\ntls_min_version = "1.2"\nh2c = true\n' \
        "$1" "$TLS_CERT" "$TLS_KEY"
}

# sluice_accepts BIN CONFIG TOML [h2c]: does sluice's --check-config take
# TOML in [server] (with h2c: and h2c = true; without: TOML less that
# line)? Prints the first line of its complaint, less the list of keys.
sluice_accepts() {
    local bin=$1 cfg=$2 toml=$3 msg
    [[ -n $bin ]] || { echo "sluice is not built"; return 1; }
    [[ -n ${4:-} ]] || toml=$(grep -v '^h2c' <<<"$toml")
    write_sluice_config "$cfg" 1 "$toml"
    msg=$("$bin" --config "$cfg" --check-config 2>&1) && return 0
    head -n1 <<<"$msg" | sed -e "s|$BENCH_TMP/||g" -e 's/; allowed:.*//' | cut -c1-200
    return 1
}

# tls_base TARGET PROTO: the scheme and authority a client of PROTO uses.
tls_base() {
    local t=$1 proto=$2
    if [[ $t == direct ]]; then echo "http://127.0.0.1:${tport[direct]}"
    elif [[ $proto == h2c ]]; then echo "http://127.0.0.1:${H2C_PORT_OF[$t]:-${tport[$t]}}"
    else echo "https://127.0.0.1:${TLS_PORT_OF[$t]}"; fi
}

# tls_curl_args PROTO: curl's flags for PROTO.
tls_curl_args() {
    case $1 in
        tls_h1) echo --http1.1 --cacert "$TLS_CERT" ;;
        tls_h2) echo --http2 --cacert "$TLS_CERT" ;;
        h2c) echo --http2-prior-knowledge ;;
    esac
}

# tls_check TARGET PROTO: "" when a chat request over PROTO gets a 200 in
# the protocol asked, else what came.
tls_check() {
    local t=$1 proto=$2 got want=2
    [[ $proto == tls_h1 ]] && want=1.1
    # shellcheck disable=SC2046  # the flags are words
    got=$(curl -s -o /dev/null -w '%{http_code} %{http_version}' --max-time 5 $(tls_curl_args "$proto") \
        -H 'Authorization: Bearer test-key' -H 'Content-Type: application/json' \
        --data-binary "$(chat_body 0 16)" "$(tls_base "$t" "$proto")/v1/chat/completions" 2>/dev/null) || true
    [[ $got == "200 $want" ]] && return 0
    if [[ -z $got || $got == 000* ]]; then echo "no HTTP answer over $(proto_name "$proto")"
    else echo "HTTP ${got% *} in HTTP/${got#* } over $(proto_name "$proto") (wanted 200 in HTTP/$want)"; fi
}

proto_name() {
    case $1 in tls_h1) echo "TLS + HTTP/1.1" ;; tls_h2) echo "TLS + h2" ;; *) echo "$1" ;; esac
}

# tls_handshake TARGET: "TLSv1.3 TLS_AES_128_GCM_SHA256 ALPN h2" from
# openssl s_client, with the clients' settings.
tls_handshake() {
    timeout 5 openssl s_client -connect "127.0.0.1:${TLS_PORT_OF[$1]}" -alpn h2,http/1.1 \
        -CAfile "$TLS_CERT" </dev/null 2>/dev/null | awk '
        /^New, / { v = $2; sub(/,$/, "", v); c = $NF }
        /^ALPN protocol:/ { a = $3 }
        /^No ALPN/ { a = "none" }
        END { if (c != "") printf "%s %s ALPN %s\n", v, c, a }'
}

# tls_stack: the stack with TLS and h2c listeners (reused across (g)-(k) of
# a layout); sets TLS_NA for what a sluice target lacks.
tls_stack() {
    [[ -n $stack_key && $stack_key == "$TLS_STACK_KEY" ]] && return 0
    stop_stack
    TLS_PORT_OF=() H2C_PORT_OF=() SLUICE_EXTRA_OF=() TLS_NA=() TLS_INFO=()
    local want=() t p msg cfg bin
    for t in "${want_targets[@]}"; do
        case $t in
            direct) want+=("$t"); continue ;;
            nginx|haproxy)
                free_port p; TLS_PORT_OF[$t]=$p
                free_port p; H2C_PORT_OF[$t]=$p ;;
            sluice|sluice-base|sluice-lean)
                free_port p; TLS_PORT_OF[$t]=$p
                SLUICE_EXTRA_OF[$t]=$(sluice_tls_toml "$p")
                cfg=$BENCH_TMP/$t-tls-check.toml bin=$(built sluice) || bin=""
                [[ $t == sluice-base ]] && bin=$base_dir/sluice
                if ! msg=$(sluice_accepts "$bin" "$cfg" "${SLUICE_EXTRA_OF[$t]}"); then
                    TLS_NA[$t.all]="its config check refuses the TLS keys: $msg"
                    log "  $t: n/a for TLS and HTTP/2 (${TLS_NA[$t.all]})"
                    continue
                fi
                if ! msg=$(sluice_accepts "$bin" "$cfg" "${SLUICE_EXTRA_OF[$t]}" h2c); then
                    # TLS without h2c, then
                    TLS_NA[$t.h2c]="its config check refuses h2c = true: $msg"
                    SLUICE_EXTRA_OF[$t]=$(sluice_tls_toml "$p" | grep -v '^h2c')
                fi ;;
            *) continue ;;   # the protocol adapters: not measured here
        esac
        want+=("$t")
    done
    local want_targets=("${want[@]}") STACK_TAG=tls
    start_stack "$LAYOUT" --reply-tokens "$B_TOKENS"
    for t in "${targets[@]}"; do
        [[ $t == direct ]] && continue
        if [[ $t == sluice* ]]; then
            local i
            for ((i = 0; i < 100; i++)); do port_open "${TLS_PORT_OF[$t]}" && break; sleep 0.05; done
            if ! port_open "${TLS_PORT_OF[$t]}"; then
                TLS_NA[$t.tls_h1]="its TLS port ${TLS_PORT_OF[$t]} (listen_tls) does not answer within 5 s"
                TLS_NA[$t.tls_h2]=${TLS_NA[$t.tls_h1]}
            fi
        fi
        TLS_INFO[$t]=$(tls_handshake "$t") || true   # nothing when its TLS port is closed
        for p in tls_h1 tls_h2 h2c; do
            [[ -n ${TLS_NA[$t.$p]:-} ]] && continue
            msg=$(tls_check "$t" "$p")
            [[ -z $msg ]] && continue
            [[ $t == sluice* ]] || die "$t: $msg (its config: $BENCH_TMP/$t-${tport[$t]}/; rerun with --keep)"
            TLS_NA[$t.$p]=$msg
        done
        for p in tls_h1 tls_h2 h2c; do
            [[ -n ${TLS_NA[$t.$p]:-} ]] && log "  $t: n/a for $(proto_name "$p") (${TLS_NA[$t.$p]})"
        done
    done
    TLS_STACK_KEY=$stack_key
}

# tls_na TARGET WORKLOAD: why TARGET was not measured in WORKLOAD (empty:
# it was, or it is not a TLS workload).
tls_na() {
    local p
    p=$(tls_proto "$2")
    [[ -n $p ]] || return 0
    echo "${TLS_NA[$1.all]:-${TLS_NA[$1.$p]:-}}"
}

# tls_na_row WORKLOAD TARGET COLUMNS: the table row of a target that lacks
# the workload's protocol; fails when it does not.
tls_na_row() {
    [[ -n $(tls_na "$2" "$1") ]] || return 1
    local row="| $2 | n/a (unsupported) |" i
    for ((i = 2; i < $3; i++)); do row+=" - |"; done
    echo "$row"
}

# tls_enter WORKLOAD: the start of every TLS workload: the stack, the
# targets that speak its protocol (TLS_TARGETS) and their URLs (URL_OF).
tls_enter() {
    local w=$1 proto t
    proto=$(tls_proto "$w")
    log "== $LAYOUT: $(workload_desc "$w")"
    tls_stack
    TLS_TARGETS=() URL_OF=()
    for t in "${targets[@]}"; do
        [[ -n $(tls_na "$t" "$w") ]] && continue
        TLS_TARGETS+=("$t")
        [[ $t == direct ]] || URL_OF[$t]=$(tls_base "$t" "$proto")
    done
    # shellcheck disable=SC2207
    FETCH_ARGS=($(tls_curl_args "$proto"))
}

tls_leave() { URL_OF=() FETCH_ARGS=(); }

# (g), (k): wrk over https (HTTP/1.1; wrk offers no ALPN), as (a) and (d).
run_workload_g() { tls_wrk_workload g "$WRK_THREADS" 32; }
run_workload_k() { tls_wrk_workload k 1 1; }
tls_wrk_workload() {
    local w=$1 threads=$2 conns=$3
    tls_files
    local -x OPENSSL_CONF=$TLS_DIR/client.cnf
    tls_enter "$w"
    local targets=("${TLS_TARGETS[@]}")
    check_replies "$w" 0 "$A_TOKENS"
    wrk_rounds "$w" chat.lua "$A_TOKENS" "$conns" "$threads"
    tls_leave
}

# (h), (i), (j): h2load, H2_CONNS connections × H2_STREAMS streams; direct
# over HTTP/1.1 (--h1, one request at a time per connection).
run_workload_h() { tls_h2_workload h 0 "$A_TOKENS"; }
run_workload_i() { tls_h2_workload i 1 "$B_TOKENS"; }
run_workload_j() { tls_h2_workload j 1 "$B_TOKENS"; }

tls_h2_cmd() {
    local t=$1 secs=$2 mode=(-m "$H2_STREAMS")
    [[ $t == direct ]] && mode=(--h1 -m 1)
    H2LOAD=("${LOAD_PIN[@]}" h2load -t "$WRK_THREADS" -c "$H2_CONNS" "${mode[@]}" -D "$secs"
            --tls13-ciphers "$TLS_SUITE" -d "$H2_BODY"
            -H 'content-type: application/json' -H 'authorization: Bearer test-key'
            "${URL_OF[$t]:-http://127.0.0.1:${tport[$t]}}/v1/chat/completions")
}

tls_h2_workload() {
    local w=$1 stream=$2 tok=$3
    tls_files
    local -x OPENSSL_CONF=$TLS_DIR/client.cnf
    tls_enter "$w"
    local targets=("${TLS_TARGETS[@]}") H2_BODY=$BENCH_TMP/$w-body.json t
    check_replies "$w" "$stream" "$tok"
    local flags=(--max-tokens "$tok")
    ((stream)) && flags+=(--stream)
    node "$BENCH_DIR/chat-body.mjs" "${flags[@]}" >"$H2_BODY"
    for t in "${targets[@]}"; do
        tls_h2_cmd "$t" 2
        "${H2LOAD[@]}" >"$BENCH_TMP/warm-$LAYOUT-$w-$t.txt" 2>&1 || true
        check_alive
        local r
        r=$(h2load_result "$BENCH_TMP/warm-$LAYOUT-$w-$t.txt")
        [[ -n $r && ${r##* } == 0 ]] || log "  warning: warm-up through $t had errors (or no result): ${r:-none}"
    done
    local n=${#targets[@]} round i
    for ((round = 1; round <= rounds; round++)); do
        for ((i = 0; i < n; i++)); do
            t=${targets[(i + round - 1) % n]}
            tls_h2_cmd "$t" "$duration"
            measure_h2load "$w" "$RESULTS_H" "$t" "$round"
        done
    done
    tls_leave
}

# print_h2 LAYOUT WORKLOAD: the table of (h), (i) or (j).
print_h2() {
    local l=$1 w=$2 f=$RESULTS_H t s o line errs
    havex "$f" "$l" "$w" "" || return 0
    echo
    echo "### $(workload_desc "$w")"
    echo
    echo "h2load -c $H2_CONNS -m $H2_STREAMS -D ${duration}s (direct: --h1 -m 1, plaintext), the chat body of $([[ $w == h ]] && echo "(a)" || echo "(b)"). Times are h2load's \"time for request\". Proxy CPU µs/req: CPU time of the proxy's threads (schedstat) over the run ÷ requests. Errors: failed requests and replies not 2xx (a run with any is flagged). Protocol: what h2load negotiated, and the TLS 1.3 suite. Spread: of req/s."
    echo
    echo "| target | req/s | mean µs | max µs | proxy CPU µs/req | CPU 1 µs/req | errors | protocol | same reply | spread |"
    echo "|---|---:|---:|---:|---:|---:|---:|---|---|---:|"
    for t in "${all_targets[@]}"; do
        if ! havex "$f" "$l" "$w" "$t"; then
            tls_na_row "$w" "$t" 10 || true
            continue
        fi
        errs=$(sumx "$f" "$l" "$w" "$t" 9)
        ((errs > 0)) && errs="**$errs (FLAGGED)**"
        echo "| $t | $(colx "$f" "$l" "$w" "$t" 5) | $(colx "$f" "$l" "$w" "$t" 6) | $(colx "$f" "$l" "$w" "$t" 8) |" \
            "$(colx "$f" "$l" "$w" "$t" 11) | $(colx "$f" "$l" "$w" "$t" 12) | $errs |" \
            "$(awk -F'\t' -v l="$l" -v w="$w" -v t="$t" '$1 == l && $2 == w && $3 == t { print $15 " " $16 }' "$f" | sort -u | paste -sd/) |" \
            "${same[$l.$w.$t]:-} | $(spreadx "$f" "$l" "$w" "$t" 5) |"
    done
    for s in sluice sluice-base sluice-lean; do
        if ! havex "$f" "$l" "$w" "$s"; then
            [[ $s == sluice && -n $(tls_na sluice "$w") ]] && { echo; echo "- sluice ratios: n/a ($(tls_na sluice "$w"))"; }
            continue
        fi
        echo
        for o in nginx haproxy; do
            havex "$f" "$l" "$w" "$o" || continue
            line="- $s ÷ $o: req/s $(ratio "$(colx "$f" "$l" "$w" "$s" 5)" "$(colx "$f" "$l" "$w" "$o" 5)")"
            line+=", mean $(ratio "$(colx "$f" "$l" "$w" "$s" 6)" "$(colx "$f" "$l" "$w" "$o" 6)")"
            line+=", proxy CPU/req $(ratio "$(colx "$f" "$l" "$w" "$s" 11)" "$(colx "$f" "$l" "$w" "$o" 11)")"
            [[ $l == pinned ]] && line+=", CPU 1/req $(ratio "$(colx "$f" "$l" "$w" "$s" 12)" "$(colx "$f" "$l" "$w" "$o" 12)")"
            echo "$line"
        done
    done
}

# tls_cell LAYOUT WORKLOAD TARGET MEASURE: one figure of the summary:
# MEASURE cpu (proxy CPU µs/req), rps (req/s) or p50 (added p50 µs).
tls_cell() {
    local l=$1 w=$2 t=$3 m=$4 v=""
    if [[ $w == [gk] ]]; then
        have "$l" "$w" "$t" && case $m in
            cpu) v=$(col "$l" "$w" "$t" 10) ;;
            rps) v=$(col "$l" "$w" "$t" 5) ;;
            p50) v=$(diffx "$(col "$l" "$w" "$t" 6)" "$(col "$l" "$w" direct 6)") ;;
        esac
    elif havex "$RESULTS_H" "$l" "$w" "$t"; then
        v=$(colx "$RESULTS_H" "$l" "$w" "$t" "$([[ $m == cpu ]] && echo 11 || echo 5)")
    fi
    if [[ -n ${v:-} ]]; then echo "$v"
    elif [[ -n $(tls_na "$t" "$w") ]]; then echo "n/a (unsupported)"
    else echo "-"; fi
}

# print_tls_summary: issue 16's rows, sluice against nginx (and HAProxy).
print_tls_summary() {
    local rows=() row l w m what s n h r
    for row in "pinned g cpu TLS+HTTP/1.1 JSON pinned CPU/req (µs) sluice ÷ nginx" \
               "pinned h cpu TLS+h2 JSON pinned CPU/req (µs) sluice ÷ nginx" \
               "shared g rps TLS+HTTP/1.1 JSON shared req/s sluice ÷ nginx" \
               "shared h rps TLS+h2 JSON shared req/s sluice ÷ nginx" \
               "shared i rps h2c SSE 41KB shared req/s sluice ÷ nginx" \
               "shared j rps TLS+h2 SSE 41KB shared req/s sluice ÷ nginx" \
               "pinned k p50 one TLS connection added p50 (µs) sluice vs nginx, pinned" \
               "shared k p50 one TLS connection added p50 (µs) sluice vs nginx, shared"; do
        read -r l w m what <<<"$row"
        [[ " ${layouts[*]} " == *" $l "* && " ${want_workloads[*]} " == *" $w "* ]] && rows+=("$row")
    done
    ((${#rows[@]})) || return 0
    echo
    echo "## TLS and HTTP/2 (issue 16): sluice against nginx"
    echo
    if [[ -e /proc/net/tls_stat ]]; then
        echo "kTLS: the kernel's tls module is loaded (/proc/net/tls_stat: $(awk '$1 ~ /^TlsCurr/ { printf "%s %s ", $1, $2 }' /proc/net/tls_stat)); none of the configs here asks for it"
    else
        echo "kTLS: off (no /proc/net/tls_stat)"
    fi
    echo
    echo "Certificate: self-signed EC P-256, the same for all. $(openssl version | awk '{print $1 "/" $2}'), $(h2load --version 2>&1 | head -n1 | sed 's/^h2load //'). Handshake (openssl s_client with the clients' settings):"
    for s in nginx haproxy sluice sluice-base sluice-lean; do
        [[ -n ${TLS_INFO[$s]+set} || -n ${TLS_NA[$s.all]:-} ]] || continue
        echo "- $s: ${TLS_INFO[$s]:-none (${TLS_NA[$s.all]:-${TLS_NA[$s.tls_h1]:-no TLS answer}})}"
    done
    echo
    echo "| measure | sluice | nginx | HAProxy | ratio |"
    echo "|---|---:|---:|---:|---:|"
    for row in "${rows[@]}"; do
        read -r l w m what <<<"$row"
        s=$(tls_cell "$l" "$w" sluice "$m") n=$(tls_cell "$l" "$w" nginx "$m") h=$(tls_cell "$l" "$w" haproxy "$m")
        r=-; [[ $s =~ ^-?[0-9.]+$ ]] && r=$(ratio "$s" "$n")
        echo "| ($w) $what | $s | $n | $h | $r |"
    done
    [[ -n $(tls_na sluice g)$(tls_na sluice h)$(tls_na sluice i) ]] &&
        echo && echo "sluice: n/a where it does not support the protocol yet: ${TLS_NA[sluice.all]:-${TLS_NA[sluice.tls_h2]:-${TLS_NA[sluice.h2c]:-${TLS_NA[sluice.tls_h1]:-}}}}"
    return 0
}
