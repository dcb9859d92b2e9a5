#!/usr/bin/env bash
# shellcheck disable=SC2154  # globals of bench/compare, which sources this
# bench/compare-figures.sh: the figures file of bench/compare (the medians of
# its report's tables, which bench/chart.mjs draws) and the count of
# disturbed runs. Sourced by bench/compare (it reads compare's globals:
# RESULTS*, layouts, want_workloads, all_targets, started, machine, commit,
# rounds, duration, max_foreign; and its helpers colx, havex,
# workload_desc); not run on its own. bench/chart.test.mjs sources it
# with results files of its own.

# count_disturbed: DISTURBED runs of RUNS during which other processes
# used more than --max-foreign percent of a core.
count_disturbed() {
    DISTURBED=$(( $(awk -F'\t' -v m="$max_foreign" '$12 > m' "$RESULTS" | wc -l) +
                  $(awk -F'\t' -v m="$max_foreign" '$15 > m' "$RESULTS_C" | wc -l) +
                  $(awk -F'\t' -v m="$max_foreign" '$13 > m' "$RESULTS_E" "$RESULTS_H" | wc -l) ))
    RUNS=$(cat "$RESULTS" "$RESULTS_C" "$RESULTS_E" "$RESULTS_H" | wc -l)
}

# figure_columns WORKLOAD: FIG_FILE, the results file of a workload, and
# FIG_COLS, "metric:column" pairs of it (bench/chart.mjs's metric names).
figure_columns() {
    case $1 in
        a|b|d|g|k) FIG_FILE=$RESULTS FIG_COLS=(req_per_s:5 p50_us:6 p99_us:7 proxy_cpu_us_per_req:10
                   proxy_user_us_per_req:14 cpu1_us_per_req:11) ;;
        c) FIG_FILE=$RESULTS_C FIG_COLS=(events_per_s:5 proxy_cpu_us_per_event:11 proxy_user_us_per_event:17
           cpu1_us_per_event:12 gap_p50_us:13 gap_p99_us:14) ;;
        e) FIG_FILE=$RESULTS_E FIG_COLS=(req_per_s:5 mean_us:6 max_us:8 proxy_cpu_us_per_req:11 cpu1_us_per_req:12) ;;
        h|i|j) FIG_FILE=$RESULTS_H FIG_COLS=(req_per_s:5 mean_us:6 max_us:8 proxy_cpu_us_per_req:11 cpu1_us_per_req:12) ;;
        f) FIG_FILE=$RESULTS_F FIG_COLS=(kib_per_stream:11 fds_per_stream:12) ;;
        *) FIG_FILE="" FIG_COLS=() ;;
    esac
}

# print_figures: the medians of the report's tables, one per line, for
# bench/chart.mjs (format: the head of bench/chart.mjs). Figures not
# measured ("-") are left out.
print_figures() {
    local l w t mc v
    count_disturbed
    echo "# bench/compare figures (bench/chart.mjs reads them): medians over rounds"
    printf 'meta\tstarted\t%s\n' "$started"
    printf 'meta\tmachine\t%s\n' "$machine"
    printf 'meta\tsource\t%s\n' "bench/compare at commit $commit, $rounds rounds × ${duration}s per target"
    if ((DISTURBED)); then
        printf 'meta\tnote\t%s\n' "$DISTURBED of $RUNS runs were disturbed by other load: see the report."
    fi
    for w in "${want_workloads[@]}"; do printf 'workload\t%s\t%s\n' "$w" "$(workload_desc "$w")"; done
    for l in "${layouts[@]}"; do
        for w in "${want_workloads[@]}"; do
            figure_columns "$w"
            [[ -n $FIG_FILE ]] || continue
            for t in "${all_targets[@]}"; do
                havex "$FIG_FILE" "$l" "$w" "$t" || continue
                for mc in "${FIG_COLS[@]}"; do
                    # (median's grep fails on a column of "-" alone: pipefail)
                    v=$(colx "$FIG_FILE" "$l" "$w" "$t" "${mc#*:}") || v=-
                    if [[ -n $v && $v != - ]]; then
                        printf 'figure\t%s\t%s\t%s\t%s\t%s\n' "$l" "$w" "$t" "${mc%%:*}" "$v"
                    fi
                done
            done
        done
    done
}
