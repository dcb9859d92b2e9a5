#!/usr/bin/env bash
# bench/compare-cef.sh: workloads (c) token trickle, (e) h2load at a fixed
# rate and (f) idle streams for bench/compare, and their report tables.
# Sourced by bench/compare (it uses compare's globals and helpers: measure,
# wait_quiet, tport/tpid, RESULTS, BENCH_TMP); not run on its own.
# --- workloads (c), (e), (f) ----------------------------------------------------

# guarded TARGET OUTFILE CMD...: run CMD (stdout and stderr to OUTFILE) as
# measure() runs wrk: after wait_quiet, and redone when other load disturbed
# it. Sets FOREIGN (percent of a core other processes used, over the run's
# wall time), TRY, PROXY_NS (CPU ns of the target's processes, from
# schedstat) and CORE_TICKS (busy ticks of CPU 1) over the run.
guarded() {
    local t=$1 out=$2; shift 2
    local try a0 a1 o0 o1 p0 p1 c0 c1 ns0 ns1
    for try in 1 2 3; do
        wait_quiet
        p0=0; [[ $t != direct ]] && p0=$(proc_cpu_ns "${tpid[$t]}")
        c0=$(cpu_busy_ticks 1); a0=$(task_busy_ticks); our_ticks; o0=$OUR_TICKS
        ns0=$(date +%s%N)
        "$@" >"$out" 2>&1 || true
        ns1=$(date +%s%N)
        p1=0; [[ $t != direct ]] && p1=$(proc_cpu_ns "${tpid[$t]}")
        c1=$(cpu_busy_ticks 1); a1=$(task_busy_ticks); our_ticks; o1=$OUR_TICKS
        check_alive
        FOREIGN=$(( ((a1 - a0) - (o1 - o0)) * 100 * 1000000000 / ((ns1 - ns0) * CLK_TCK) ))
        ((FOREIGN < 0)) && FOREIGN=0
        ((FOREIGN <= max_foreign)) && break
        ((QUIET)) || break
        ((try < 3)) && log "  disturbed: other processes used ${FOREIGN}% of a core during the run; redoing"
    done
    TRY=$try PROXY_NS=$((p1 - p0)) CORE_TICKS=$((c1 - c0))
}

# per_unit TICKS N: CPU µs per unit, one decimal; "-" when TICKS < 0 or N is 0.
per_unit() {
    awk -v d="$1" -v n="$2" -v hz="$CLK_TCK" 'BEGIN {
        if (d < 0 || n <= 0) print "-"; else printf "%.1f\n", d * 1e6 / hz / n }'
}
# per_unit_ns NS N: the same from nanoseconds.
per_unit_ns() {
    awk -v d="$1" -v n="$2" 'BEGIN {
        if (d < 0 || n <= 0) print "-"; else printf "%.1f\n", d / 1e3 / n }'
}

# record_commands CMD...: the command as the report lists it.
record_command() { echo "\$ $*" >>"$BENCH_TMP/commands.txt"; }

# (c) Token trickle. bench/trickle.mjs holds C_STREAMS streams open (a new
# request on the same connection as soon as a reply ends), counts the SSE
# events it receives in its window, and reads the proxy's CPU ticks (and
# CPU 1's) from /proc at the window's two ends: the ramp-up and the ends of
# the run stay out of the figures.
run_workload_c() {
    log "== $LAYOUT: $(workload_desc c)"
    # Without http-no-delay HAProxy sends with MSG_MORE while a reply is
    # incomplete, and the kernel holds paced events (and the head) up to
    # 200 ms: tokens arrive in clumps (nginx's counterpart is proxy_buffering
    # off, in its config for every workload). HAPROXY_NO_DELAY=all sets it
    # for every workload, =none for none.
    local HAPROXY_DEFAULTS_EXTRA=""
    [[ ${HAPROXY_NO_DELAY:-stream} != none ]] && HAPROXY_DEFAULTS_EXTRA="option http-no-delay"
    start_stack "$LAYOUT" --reply-tokens "$C_TOKENS" --tokens-per-sec "$C_RATE"
    # A short reply, unless an adapter is measured: its events per reply
    # (EVENT_DELTA, what measure_c expects) come from a reply of the
    # workload's own length (its finish "stop" may travel in the last token's
    # chunk or in one of its own); C_TOKENS / C_RATE s per target.
    local check_tokens=20 t
    for t in "${targets[@]}"; do [[ $t == sluice-anthropic || $t == sluice-triton ]] && check_tokens=$C_TOKENS; done
    check_replies c 1 "$check_tokens"
    local n=${#targets[@]} round i
    for ((round = 1; round <= rounds; round++)); do
        for ((i = 0; i < n; i++)); do
            measure_c "${targets[(i + round - 1) % n]}" "$round"
        done
    done
}

measure_c() {
    local t=$1 round=$2 out r pids="" cpu_arg=()
    out=$BENCH_TMP/trickle-$LAYOUT-$t-r$round.txt
    [[ $t != direct ]] && pids=$(proc_pids "${tpid[$t]}")
    [[ $LAYOUT == pinned ]] && cpu_arg=(--cpu 1)
    # The ramp spreads the streams' first requests over one reply's length;
    # the window opens a second after the last one started.
    local ramp_ms=$((C_TOKENS * 1000 / C_RATE))
    local cmd=("${LOAD_PIN[@]}" node "$BENCH_DIR/trickle.mjs"
               --url "http://127.0.0.1:${tport[$t]}/v1/chat/completions"
               --streams "$C_STREAMS" --max-tokens "$C_TOKENS" --expect-events $((C_TOKENS + 3 + ${EVENT_DELTA[$t]:-0}))
               --ramp-ms "$ramp_ms" --warmup-ms $((ramp_ms + 1000)) --seconds "$c_secs")
    record_command "${cmd[@]}" --pids PIDS "${cpu_arg[@]}"
    guarded "$t" "$out" "${cmd[@]}" --pids "$pids" "${cpu_arg[@]}"
    r=$(grep -m1 '^TRICKLE_RESULT ' "$out" || true)
    if [[ -z $r ]]; then
        log "bench/trickle.mjs failed against $t:"; cat "$out" >&2
        die "trickle client failed"
    fi
    local events us_proc us_core us_user="-" us_sys="-"
    events=$(field "$r" events)
    us_proc=$(per_unit_ns "$(field "$r" proxy_ns)" "$events")
    if [[ $t != direct ]]; then
        us_user=$(per_unit "$(field "$r" proxy_user_ticks)" "$events")
        us_sys=$(per_unit "$(field "$r" proxy_sys_ticks)" "$events")
    fi
    us_core="-"
    [[ $LAYOUT == pinned && $t != direct ]] && us_core=$(per_unit "$(field "$r" cpu_ticks)" "$events")
    printf '%s\tc\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$LAYOUT" "$t" "$round" \
        "$(field "$r" events_per_s)" "$events" "$(field "$r" responses)" "$(field "$r" bad)" \
        "$(field "$r" errors)" "$(field "$r" open_min)" "$us_proc" "$us_core" \
        "$(field "$r" gap_p50_us)" "$(field "$r" gap_p99_us)" "$FOREIGN" "$TRY" "$us_user" "$us_sys" >>"$RESULTS_C"
    log "  $(printf '%-7s c  %-16s round %s: %6s events/s  open ≥ %3s  cpu/event %5s µs (user %s, sys %s)  gap p99 %6s µs  bad %s  errors %s  foreign %s%%' \
        "$LAYOUT" "$t" "$round" "$(field "$r" events_per_s)" "$(field "$r" open_min)" "$us_proc" "$us_user" "$us_sys" \
        "$(field "$r" gap_p99_us)" "$(field "$r" bad)" "$(field "$r" errors)" "$FOREIGN")"
}

# (e) h2load at a fixed rate: --rps per client, timed (-D), one request at a
# time per connection, the non-stream chat body of (a).
h2load_cmd() {
    local t=$1 secs=$2
    H2LOAD=("${LOAD_PIN[@]}" h2load --h1 -t "$WRK_THREADS" -c "$E_CLIENTS"
            --rps $(((E_RATE + E_CLIENTS - 1) / E_CLIENTS)) -D "$secs"
            -d "$BENCH_TMP/e-body.json" -H 'Authorization: Bearer test-key'
            -H 'Content-Type: application/json'
            "http://127.0.0.1:${tport[$t]}/v1/chat/completions")
}

# h2load_result FILE: "rps mean_us sd_us max_us done errors" from h2load's
# summary (times come as 383us, 3.28ms or 1.2s); empty if there is none.
h2load_result() {
    awk 'function us(v) {
            if (v ~ /us$/) return v + 0
            if (v ~ /ms$/) return v * 1000
            if (v ~ /s$/) return v * 1e6
            return v + 0 }
        /^finished in / { rps = $4 }
        /^requests: / { done = $6; failed = $10 }
        /^status codes: / { ok = $3 }
        /^time for request:/ { min = us($4); max = us($5); mean = us($6); sd = us($7); have = 1 }
        END {
            if (!have) exit
            err = done - ok; if (failed > err) err = failed
            printf "%.0f %.0f %.0f %.0f %d %d\n", rps, mean, sd, max, done, err }' "$1"
}

run_workload_e() {
    log "== $LAYOUT: $(workload_desc e)"
    start_stack "$LAYOUT" --reply-tokens "$B_TOKENS"
    check_replies e 0 "$A_TOKENS"
    node "$BENCH_DIR/chat-body.mjs" --max-tokens "$A_TOKENS" >"$BENCH_TMP/e-body.json"
    local t n=${#targets[@]} round i
    # Warm-up: fills keep-alive pools and caches, not recorded.
    for t in "${targets[@]}"; do
        h2load_cmd "$t" 1
        "${H2LOAD[@]}" >"$BENCH_TMP/warm-$LAYOUT-e-$t.txt" 2>&1 || true
        check_alive
    done
    for ((round = 1; round <= rounds; round++)); do
        for ((i = 0; i < n; i++)); do
            measure_e "${targets[(i + round - 1) % n]}" "$round"
        done
    done
}

measure_e() {
    h2load_cmd "$1" "$e_secs"
    measure_h2load e "$RESULTS_E" "$1" "$2"
}

# measure_h2load WORKLOAD FILE TARGET ROUND: run H2LOAD (the caller built
# it) as guarded runs it and add a line to FILE: (e)'s columns, and for
# other workloads the protocol and TLS suite h2load negotiated.
measure_h2load() {
    local w=$1 f=$2 t=$3 round=$4 out r
    out=$BENCH_TMP/h2load-$LAYOUT-$w-$t-r$round.txt
    [[ $w == e ]] && out=$BENCH_TMP/h2load-$LAYOUT-$t-r$round.txt   # (e): its names as before
    record_command "${H2LOAD[@]}"
    guarded "$t" "$out" "${H2LOAD[@]}"
    r=$(h2load_result "$out")
    if [[ -z $r ]]; then
        log "h2load failed against $t:"; cat "$out" >&2
        die "h2load failed"
    fi
    local rps mean sd max requests errors us_proc="-" us_core="-" extra=""
    read -r rps mean sd max requests errors <<<"$r"
    if [[ $t != direct ]]; then
        us_proc=$(per_unit_ns "$PROXY_NS" "$requests")
        [[ $LAYOUT == pinned ]] && us_core=$(per_unit "$CORE_TICKS" "$requests")
    fi
    [[ $w != e ]] && extra=$(awk '/^Application protocol:/ { p = $3 } /^Cipher:/ { c = $2 }
        END { printf "\t%s\t%s", p == "" ? "-" : p, c == "" ? "-" : c }' "$out")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s%s\n' "$LAYOUT" "$w" "$t" "$round" \
        "$rps" "$mean" "$sd" "$max" "$errors" "$requests" "$us_proc" "$us_core" "$FOREIGN" "$TRY" "$extra" >>"$f"
    log "  $(printf '%-7s %-2s %-11s round %s: %6s req/s  mean %6s µs  sd %6s µs  max %7s µs  cpu/req %5s µs  errors %s  foreign %s%%' \
        "$LAYOUT" "$w" "$t" "$round" "$rps" "$mean" "$sd" "$max" "$us_proc" "$errors" "$FOREIGN")"
}

# (f) Idle streams. Each measure gets a fresh mock-vllm and a fresh proxy:
# memory a previous run freed stays in the process (the allocator keeps it)
# and would hide what the next run allocates. sluice's defaults cap a shard
# at 1024 connections per backend and 4096 requests in flight, and end a
# stream with no byte for 30 s: raised for this workload (nginx's
# proxy_read_timeout and HAProxy's timeout server are 120 s).
F_SLUICE_EXTRA='connections_max = 65536
inflight_max = 65536

[upstream]
connections_max = 65536
stream_idle_timeout_ms = 120000'

run_workload_f() {
    log "== $LAYOUT: $(workload_desc f)"
    local proxies=() t
    for t in "${want_targets[@]}"; do [[ $t != direct ]] && proxies+=("$t"); done
    if ((${#proxies[@]} == 0)); then
        log "  (f) measures proxies only: none among the targets"
        return 0
    fi
    stop_stack
    local n=${#proxies[@]} round i
    for ((round = 1; round <= rounds; round++)); do
        for ((i = 0; i < n; i++)); do
            measure_f "${proxies[(i + round - 1) % n]}" "$round"
        done
    done
}

measure_f() {
    local t=$1 round=$2 out r cap
    # start_stack starts these targets; the proxy's probe is a stream whose
    # head is all that comes.
    local want_targets=(direct "$t") SLUICE_EXTRA=$F_SLUICE_EXTRA PROBE_STREAM=1
    start_stack "$LAYOUT" --ttft-ms "$F_TTFT_MS"
    if [[ -z ${tport[$t]:-} ]]; then stop_stack; return 0; fi
    # Limits of the proxies' configs, beyond the descriptors idle.mjs checks.
    case $t in
        nginx) cap=$((NGINX_WORKER_CONNECTIONS * 15 / 16 / 2)) ;;
        haproxy) cap=$HAPROXY_MAXCONN ;;
        *) cap=$idle_streams ;;
    esac
    out=$BENCH_TMP/idle-$LAYOUT-$t-r$round.txt
    local cmd=("${LOAD_PIN[@]}" node "$BENCH_DIR/idle.mjs" --port "${tport[$t]}"
               --streams "$idle_streams" --cap "$cap" --settle-ms $((f_hold_s * 1000)))
    record_command "${cmd[@]}" --pids PIDS --backend-pid PID
    wait_quiet
    "${cmd[@]}" --pids "$(proc_pids "${tpid[$t]}")" --backend-pid "${tpid[direct]}" >"$out" 2>&1 || true
    check_alive
    stop_stack
    grep '^warning: ' "$out" | sed "s/^warning: /  warning ($t): /" >&2 || true
    r=$(grep -m1 '^IDLE_RESULT ' "$out" || true)
    if [[ -z $r ]]; then
        log "bench/idle.mjs failed against $t:"; cat "$out" >&2
        die "idle client failed"
    fi
    local open base rss fds0 fds1 kib fds
    open=$(field "$r" open) base=$(field "$r" rss_base_kb) rss=$(field "$r" rss_open_kb)
    fds0=$(field "$r" fds_base) fds1=$(field "$r" fds_open)
    kib=$(awk -v a="$rss" -v b="$base" -v n="$open" 'BEGIN { if (n > 0) printf "%.2f\n", (a - b) / n; else print "-" }')
    fds=$(awk -v a="$fds1" -v b="$fds0" -v n="$open" 'BEGIN { if (n > 0) printf "%.2f\n", (a - b) / n; else print "-" }')
    printf '%s\tf\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$LAYOUT" "$t" "$round" \
        "$(field "$r" asked)" "$(field "$r" target)" "$open" "$(field "$r" failed)" "$base" "$rss" \
        "$kib" "$fds" "$(field "$r" open_ms)" >>"$RESULTS_F"
    log "  $(printf '%-7s f  %-11s round %s: %5s streams open  RSS %6s -> %7s KiB  %6s KiB/stream  %s fds/stream  failed %s' \
        "$LAYOUT" "$t" "$round" "$open" "$base" "$rss" "$kib" "$fds" "$(field "$r" failed)")"
}


# The same for the results of (c), (e), (f), which have their own columns:
# colx FILE LAYOUT WORKLOAD TARGET COLUMN, and so on.
colx() {
    awk -F'\t' -v l="$2" -v w="$3" -v t="$4" -v c="$5" \
        '$1 == l && $2 == w && $3 == t { print $c }' "$1" | median
}
sumx() {
    awk -F'\t' -v l="$2" -v w="$3" -v t="$4" -v c="$5" \
        '$1 == l && $2 == w && $3 == t { s += $c } END { print s + 0 }' "$1"
}
spreadx() {
    awk -F'\t' -v l="$2" -v w="$3" -v t="$4" -v c="$5" '$1 == l && $2 == w && $3 == t && $c != "-" { print $c }' "$1" |
        sort -g | awk '{ v[NR] = $1 } END {
            if (NR < 2) { print "-"; exit }
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%.0f%%\n", m ? (v[NR] - v[1]) * 100 / m : 0 }'
}
havex() { awk -F'\t' -v l="$2" -v w="$3" -v t="$4" '$1 == l && $2 == w && ($3 == t || t == "") { f = 1 } END { exit !f }' "$1"; }
# diff A B: A − B, or "-" when either is missing.
diffx() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "-" || b == "-") print "-"; else print a - b }'; }

print_c() {
    local l=$1 f=$RESULTS_C t s o line
    havex "$f" "$l" c "" || return 0
    echo
    echo "### $(workload_desc c)"
    echo
    echo "$C_STREAMS streams, each reply $C_TOKENS tokens at $C_RATE tokens/s ($((C_TOKENS + 3)) events), one after another per connection; ${c_secs} s window. Events: \`data:\` lines received in the window. Proxy CPU µs/event: CPU time of the proxy's threads (nginx's workers included; /proc/PID/task/*/schedstat) over the window ÷ events. Of it user / sys: utime / stime (/proc/PID/task/*/stat, 10 ms ticks) ÷ events. Gap: time between two reads of one stream that brought events (10 ms = the pacing). Spread: of proxy CPU/event."
    echo
    echo "| target | events/s | events | replies | streams open (min) | proxy CPU µs/event | of it user | of it sys | CPU 1 µs/event | gap p50 µs | gap p99 µs | errors | bad replies | same reply | spread |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
    for t in "${all_targets[@]}"; do
        havex "$f" "$l" c "$t" || continue
        echo "| $t | $(colx "$f" "$l" c "$t" 5) | $(colx "$f" "$l" c "$t" 6) | $(colx "$f" "$l" c "$t" 7) |" \
            "$(colx "$f" "$l" c "$t" 10) | $(colx "$f" "$l" c "$t" 11) | $(colx "$f" "$l" c "$t" 17) | $(colx "$f" "$l" c "$t" 18) |" \
            "$(colx "$f" "$l" c "$t" 12) |" \
            "$(colx "$f" "$l" c "$t" 13) | $(colx "$f" "$l" c "$t" 14) | $(sumx "$f" "$l" c "$t" 9) |" \
            "$(sumx "$f" "$l" c "$t" 8) | ${same[$l.c.$t]:-} | $(spreadx "$f" "$l" c "$t" 11) |"
    done
    for s in sluice sluice-base sluice-lean; do
        havex "$f" "$l" c "$s" || continue
        echo
        for o in nginx haproxy relay direct; do
            havex "$f" "$l" c "$o" || continue
            line="- $s ÷ $o: events/s $(ratio "$(colx "$f" "$l" c "$s" 5)" "$(colx "$f" "$l" c "$o" 5)")"
            line+=", gap p99 $(ratio "$(colx "$f" "$l" c "$s" 14)" "$(colx "$f" "$l" c "$o" 14)")"
            if [[ $o != direct ]]; then
                line+=", proxy CPU/event $(ratio "$(colx "$f" "$l" c "$s" 11)" "$(colx "$f" "$l" c "$o" 11)")"
                [[ $l == pinned ]] &&
                    line+=", CPU 1/event $(ratio "$(colx "$f" "$l" c "$s" 12)" "$(colx "$f" "$l" c "$o" 12)")"
            fi
            echo "$line"
        done
    done
    # the protocol adapters against the OpenAI pass-through (issue 15: the
    # gRPC adapter's proxy CPU per event at most 1.5× the pass-through's)
    for s in "${adapters[@]}"; do
        { havex "$f" "$l" c "$s" && havex "$f" "$l" c sluice; } || continue
        local r per_round verdict=""
        r=$(ratio "$(colx "$f" "$l" c "$s" 11)" "$(colx "$f" "$l" c sluice 11)")
        per_round=$(round_ratio_in "$f" "$l" c "$s" sluice 11)
        line="- $s ÷ sluice: proxy CPU/event $r"
        ((rounds > 1)) && line+=" (per round: median $per_round)"
        line+=", of it user $(ratio "$(colx "$f" "$l" c "$s" 17)" "$(colx "$f" "$l" c sluice 17)")"
        line+=", of it sys $(ratio "$(colx "$f" "$l" c "$s" 18)" "$(colx "$f" "$l" c sluice 18)")"
        [[ $l == pinned ]] && line+=", CPU 1/event $(ratio "$(colx "$f" "$l" c "$s" 12)" "$(colx "$f" "$l" c sluice 12)")"
        line+=", events/s $(ratio "$(colx "$f" "$l" c "$s" 5)" "$(colx "$f" "$l" c sluice 5)")"
        line+=", gap p50 $(ratio "$(colx "$f" "$l" c "$s" 13)" "$(colx "$f" "$l" c sluice 13)")"
        line+=", gap p99 $(ratio "$(colx "$f" "$l" c "$s" 14)" "$(colx "$f" "$l" c sluice 14)")"
        if [[ $s == sluice-triton ]]; then
            local v=$per_round; [[ $v == - ]] && v=$r
            verdict=$(awk -v v="$v" 'BEGIN { if (v == "-") print "-"; else if (v <= 1.5) print "met"; else print "NOT met" }')
            line+="; issue 15's target (≤ 1.50): $verdict"
        fi
        echo
        echo "$line"
    done
}

print_e() {
    local l=$1 f=$RESULTS_E t s o line dmean mean added
    havex "$f" "$l" e "" || return 0
    echo
    echo "### $(workload_desc e)"
    echo
    echo "$E_CLIENTS connections (h2load --h1 -c $E_CLIENTS --rps $(((E_RATE + E_CLIENTS - 1) / E_CLIENTS))), one request at a time each, ${e_secs} s; the non-stream chat body of (a). Times are h2load's \"time for request\"; added mean = target's mean − direct's (medians over rounds). Proxy CPU µs/req: CPU time of the proxy's threads (schedstat) over the run ÷ requests. Spread: of the mean."
    echo
    echo "| target | req/s | mean µs | sd µs | max µs | added mean µs | proxy CPU µs/req | CPU 1 µs/req | errors | same reply | spread |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
    dmean=$(colx "$f" "$l" e direct 6)
    for t in "${all_targets[@]}"; do
        havex "$f" "$l" e "$t" || continue
        mean=$(colx "$f" "$l" e "$t" 6)
        added=-
        [[ $t != direct ]] && added=$(diffx "$mean" "$dmean")
        echo "| $t | $(colx "$f" "$l" e "$t" 5) | $mean | $(colx "$f" "$l" e "$t" 7) | $(colx "$f" "$l" e "$t" 8) |" \
            "$added | $(colx "$f" "$l" e "$t" 11) |" \
            "$(colx "$f" "$l" e "$t" 12) | $(sumx "$f" "$l" e "$t" 9) | ${same[$l.e.$t]:-} | $(spreadx "$f" "$l" e "$t" 6) |"
    done
    for s in sluice sluice-base sluice-lean; do
        havex "$f" "$l" e "$s" || continue
        echo
        for o in nginx haproxy relay direct; do
            havex "$f" "$l" e "$o" || continue
            line="- $s ÷ $o: mean $(ratio "$(colx "$f" "$l" e "$s" 6)" "$(colx "$f" "$l" e "$o" 6)")"
            if [[ $o != direct ]]; then
                line+=", added mean $(ratio "$(diffx "$(colx "$f" "$l" e "$s" 6)" "$dmean")" \
                    "$(diffx "$(colx "$f" "$l" e "$o" 6)" "$dmean")")"
                line+=", proxy CPU/req $(ratio "$(colx "$f" "$l" e "$s" 11)" "$(colx "$f" "$l" e "$o" 11)")"
            fi
            echo "$line"
        done
    done
    for s in "${adapters[@]}"; do
        { havex "$f" "$l" e "$s" && havex "$f" "$l" e sluice; } || continue
        echo
        echo "- $s ÷ sluice: mean $(ratio "$(colx "$f" "$l" e "$s" 6)" "$(colx "$f" "$l" e sluice 6)")," \
             "added mean $(ratio "$(diffx "$(colx "$f" "$l" e "$s" 6)" "$dmean")" "$(diffx "$(colx "$f" "$l" e sluice 6)" "$dmean")")," \
             "proxy CPU/req $(ratio "$(colx "$f" "$l" e "$s" 11)" "$(colx "$f" "$l" e sluice 11)")"
    done
}

print_f() {
    local l=$1 f=$RESULTS_F t s o
    havex "$f" "$l" f "" || return 0
    echo
    echo "### $(workload_desc f)"
    echo
    echo "Streams asked: $idle_streams; held: at most what the open-file limits allow ($(ulimit -n) per process here; see the warnings on stderr). Each stream: a streaming chat request whose response head came, then nothing (mock-vllm --ttft-ms $F_TTFT_MS). RSS: VmRSS of the proxy's processes (nginx: master + workers) after a warm-up and with every stream open, held ${f_hold_s} s; KiB per stream = RSS delta ÷ streams open. fds per stream: descriptors the proxy holds per stream. Spread: of KiB per stream."
    echo
    echo "| target | streams open | RSS before KiB | RSS open KiB | KiB per stream | fds per stream | failed | time to open ms | spread |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for t in "${all_targets[@]}"; do
        havex "$f" "$l" f "$t" || continue
        echo "| $t | $(colx "$f" "$l" f "$t" 7) | $(colx "$f" "$l" f "$t" 9) | $(colx "$f" "$l" f "$t" 10) |" \
            "$(colx "$f" "$l" f "$t" 11) | $(colx "$f" "$l" f "$t" 12) | $(sumx "$f" "$l" f "$t" 8) |" \
            "$(colx "$f" "$l" f "$t" 13) | $(spreadx "$f" "$l" f "$t" 11) |"
    done
    for s in sluice sluice-base sluice-lean; do
        havex "$f" "$l" f "$s" || continue
        echo
        for o in nginx haproxy; do
            havex "$f" "$l" f "$o" || continue
            echo "- $s ÷ $o: memory per stream $(ratio "$(colx "$f" "$l" f "$s" 11)" "$(colx "$f" "$l" f "$o" 11)")"
        done
    done
}


