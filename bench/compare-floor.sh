#!/usr/bin/env bash
# shellcheck disable=SC2154  # globals of bench/compare, which sources this
# bench/compare-floor.sh: ratios within rounds, and issue 20's table (sluice
# against the floor, bench-relay, and against nginx for h2c SSE). Sourced by
# bench/compare (it reads compare's globals: RESULTS, RESULTS_C, RESULTS_H,
# layouts, want_workloads); not run on its own. bench/floor.test.mjs
# sources it with results files of its own.

# round_ratios_in FILE LAYOUT WORKLOAD A B COLUMN: A ÷ B within each round
# that has both (the two ran minutes apart at most, so the machine's drift
# between rounds cancels), one a line, smallest first. The results files
# share their first four columns: layout, workload, target, round.
round_ratios_in() {
    awk -F'\t' -v l="$2" -v w="$3" -v a="$4" -v b="$5" -v c="$6" '
        $1 == l && $2 == w && $c != "-" { if ($3 == a) x[$4] = $c; if ($3 == b) y[$4] = $c }
        END { for (r in x) if ((r in y) && y[r] > 0) printf "%.6f\n", x[r] / y[r] }' "$1" | sort -g
}

# round_ratio_in FILE LAYOUT WORKLOAD A B COLUMN: the median of those;
# "-" when no round has both.
round_ratio_in() {
    round_ratios_in "$@" | awk '{ v[NR] = $1 } END {
        if (NR == 0) { print "-"; exit }
        printf "%.2f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# round_ratio LAYOUT WORKLOAD A B COLUMN: the same from the main results
# ((a), (b), (d), (g), (k)).
round_ratio() { round_ratio_in "$RESULTS" "$@"; }

# floor_verdict OP LIMIT: reads per-round ratios (one a line, sorted) and
# prints "median<TAB>min–max<TAB>rounds met/rounds<TAB>verdict", the
# verdict on the median ("met", "NOT met", "not measured"). OP is <= or >=.
floor_verdict() {
    awk -v op="$1" -v x="$2" '
        function ok(v) { return op == "<=" ? v <= x + 1e-9 : v >= x - 1e-9 }
        { v[NR] = $1 + 0; if (ok(sprintf("%.2f", $1) + 0)) met++ }
        END {
            if (NR == 0) { printf "-\t-\t-\tnot measured\n"; exit }
            m = sprintf("%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) + 0
            printf "%.2f\t%.2f–%.2f\t%d/%d\t%s\n", m, v[1], v[NR], met, NR, ok(m) ? "met" : "NOT met" }'
}

# print_floor_summary: issue 20's table. Each row: the median over rounds
# of sluice ÷ the reference within a round (the verdict is on it), the
# smallest and largest of those ratios, and in how many rounds the ratio
# alone met the target -- on a machine whose speed drifts, the spread says
# how far one run's median can be trusted.
print_floor_summary() {
    local rows=() row l w ref file c want what med range met verdict
    for row in "pinned b relay RESULTS 10 <=1.20 41 KB SSE pinned: proxy CPU per response ÷ floor" \
               "pinned a relay RESULTS 10 <=1.10 JSON pinned: proxy CPU per request ÷ floor" \
               "shared a relay RESULTS 5 >=0.92 JSON shared: req/s ÷ floor" \
               "pinned c relay RESULTS_C 11 <=1.15 token trickle pinned: proxy CPU per event ÷ floor" \
               "shared i nginx RESULTS_H 5 >=2.5 h2c SSE shared: req/s ÷ nginx"; do
        read -r l w ref file c want what <<<"$row"
        [[ " ${layouts[*]} " == *" $l "* && " ${want_workloads[*]} " == *" $w "* ]] && rows+=("$row")
    done
    ((${#rows[@]})) || return 0
    echo
    echo "## Issue 20's table: sluice against the floor (bench-relay) and nginx"
    echo
    echo "bench-relay: a plain L4 relay on io_uring (bench/relay), one backend connection per client connection, bytes copied both ways, nothing parsed. Ratio: sluice ÷ the reference within each round; the median over rounds decides; per round: the smallest and largest of those ratios; rounds met: in how many rounds the ratio alone met the target."
    echo
    echo "| measure | sluice ÷ ref | per round | rounds met | target | |"
    echo "|---|---:|---:|---:|---:|---|"
    for row in "${rows[@]}"; do
        read -r l w ref file c want what <<<"$row"
        IFS=$'\t' read -r med range met verdict < <(round_ratios_in "${!file}" "$l" "$w" sluice "$ref" "$c" |
            floor_verdict "${want:0:2}" "${want:2}")
        want=${want/<=/≤ }
        echo "| ($w) $what | $med | $range | $met | ${want/>=/≥ } | $verdict |"
    done
    return 0
}
