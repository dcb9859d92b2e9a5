// The status page's HTML (admin GET /) and the escapers every string put
// into it or into /status.json goes through. The page is one document
// compiled into the binary: its style and script are inline, it loads
// nothing else (the admin response forbids it: content-security-policy),
// and its tables are rendered here so that they read without JavaScript.
// With JavaScript it polls /status.json every 2 s, redraws the tables with
// DOM text nodes (never markup from data) and draws the charts as SVG.
#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "sluice/control/status.hpp"
#include "sluice/openai/error.hpp"

namespace sluice::control {

void put_html_escaped(std::string& out, std::string_view s) {
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
}

void put_json_string(std::string& out, std::string_view s) {
  std::string escaped;
  openai::append_json_string(escaped, s);
  for (char c : escaped) {
    if (c == '<') {
      out += "\\u003c";
    } else if (c == '>') {
      out += "\\u003e";
    } else if (c == '&') {
      out += "\\u0026";
    } else {
      out += c;
    }
  }
}

void put_query_escaped(std::string& out, std::string_view s) {
  static constexpr char k_hex[] = "0123456789ABCDEF";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                       c == '.' || c == '_' || c == '~';
    if (plain) {
      out += ch;
    } else {
      out += '%';
      out += k_hex[c >> 4];
      out += k_hex[c & 15];
    }
  }
}

namespace {

constexpr std::string_view k_head = R"html(<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>sluice status</title>
<style>
:root{color-scheme:light dark;--bg:#fafafa;--fg:#1d1d1f;--muted:#6b6b70;--card:#fff;--line:#e2e2e6;--ok:#1a7f37;--warn:#9a6700;--bad:#cf222e;--a:#0969da;--b:#bf3989}
@media (prefers-color-scheme:dark){:root{--bg:#16171a;--fg:#e6e6e9;--muted:#9a9aa2;--card:#1f2024;--line:#33343a;--ok:#3fb950;--warn:#d29922;--bad:#f85149;--a:#58a6ff;--b:#f778ba}}
*{box-sizing:border-box}body{margin:0;padding:1rem 1.5rem;background:var(--bg);color:var(--fg);font:14px/1.4 system-ui,sans-serif}
header{display:flex;flex-wrap:wrap;gap:1rem;align-items:baseline;justify-content:space-between}
h1{font-size:1.3rem;margin:0}h2{font-size:1rem;margin:1.5rem 0 .5rem}.muted{color:var(--muted)}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(11.5rem,1fr));gap:.6rem;margin-top:1rem}
.card{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:.5rem .7rem}
.card b{display:block;font-size:1.25rem;font-variant-numeric:tabular-nums}.card span{color:var(--muted);font-size:.8rem}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(16rem,1fr));gap:.6rem;margin-top:.6rem}
.chart{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:.4rem .6rem}
.chart svg{width:100%;height:60px;display:block}.chart .k1{color:var(--a)}.chart .k2{color:var(--b)}
table{border-collapse:collapse;width:100%;background:var(--card);border:1px solid var(--line)}
th,td{padding:.3rem .55rem;border-bottom:1px solid var(--line);text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
th{font-weight:600;color:var(--muted);font-size:.8rem}th:first-child,td:first-child{text-align:left}
td.up{color:var(--ok)}td.draining{color:var(--warn)}td.down,td.ejected{color:var(--bad)}
form{display:inline;margin:0}button{font:inherit;padding:.1rem .6rem;cursor:pointer}
input{font:inherit;padding:.15rem .4rem;width:14rem}.scroll{overflow-x:auto}
#note{color:var(--warn)}
</style></head>
)html";

constexpr std::string_view k_header = R"html(<header><h1>sluice status</h1>
<span class="muted" id="updated">)html";

constexpr std::string_view k_token = R"html(</span>
<label>Admin token <input id="token" type="password" autocomplete="off" placeholder="only if the gateway wants one"></label>
</header>
<p id="note">)html";

constexpr std::string_view k_script = R"html(<script>
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const tokenBox = $("token");
  tokenBox.value = sessionStorage.getItem("sluice-admin-token") || "";
  tokenBox.addEventListener("input", () => sessionStorage.setItem("sluice-admin-token", tokenBox.value));
  tokenBox.addEventListener("change", () => poll());
  // Served without data: the gateway wants the token, so wait for one.
  const locked = document.body.dataset.needToken === "1";
  const auth = () => tokenBox.value ? { Authorization: "Bearer " + tokenBox.value } : {};
  const fix = (v, d) => v === null || v === undefined ? "\u2013" : Number(v).toFixed(d);
  const ms = (v) => v === null || v === undefined ? "\u2013" : (v >= 1000 ? (v / 1000).toFixed(2) + " s" : v.toFixed(1) + " ms");
  const bytes = (v) => v >= 1048576 ? (v / 1048576).toFixed(1) + " MiB" : v >= 1024 ? (v / 1024).toFixed(1) + " KiB" : v + " B";
  const pair = (a, b) => a === null || b === null ? "\u2013" : Math.max(a, b) >= 1000
    ? (a / 1000).toFixed(2) + " / " + (b / 1000).toFixed(2) + " s" : a.toFixed(1) + " / " + b.toFixed(1) + " ms";
  const pct = (v) => v === null || v === undefined ? "\u2013" : (v * 100).toFixed(0) + "%";
  const when = (t) => t ? new Date(t).toLocaleTimeString() : "";
  function cells(tr, values) {
    for (const v of values) {
      const td = document.createElement("td");
      if (v instanceof Node) td.appendChild(v); else td.textContent = v;
      tr.appendChild(td);
    }
    return tr;
  }
  // Updates the table in place: a cell is rewritten only when its value
  // changed, so a button the user is pressing is not replaced under the
  // pointer by the next poll (its click would be lost).
  function fill(id, rows) {
    const body = $(id);
    while (body.children.length > rows.length) body.lastChild.remove();
    rows.forEach((r, i) => {
      let tr = body.children[i];
      if (!tr || tr.children.length !== r.length) {
        const fresh = cells(document.createElement("tr"), r);
        if (tr) tr.replaceWith(fresh); else body.appendChild(fresh);
        return;
      }
      r.forEach((v, j) => {
        const td = tr.children[j];
        if (v instanceof Node) {
          if (!(td.firstChild && td.firstChild.isEqualNode(v))) td.replaceChildren(v);
        } else if (td.textContent !== v || td.firstElementChild) {
          td.textContent = v;
        }
      });
    });
  }
  function trafficCells(name, r) {
    return [name, fix(r.requests_s, 2), fix(r.tokens_in_s, 1), fix(r.tokens_out_s, 1), fix(r.errors_4xx_s, 2),
            fix(r.errors_5xx_s, 2), ms(r.ttft_p50_ms), ms(r.ttft_p99_ms), ms(r.duration_p50_ms), ms(r.duration_p99_ms),
            String(r.totals.requests)];
  }
  function drainButton(b) {
    const drain = b.state !== "draining";
    const f = document.createElement("form");
    f.method = "post";
    f.action = "/backends/" + (drain ? "drain" : "undrain") + "?url=" + encodeURIComponent(b.url) + "&then=page";
    f.dataset.op = drain ? "drain" : "undrain";
    f.dataset.url = b.url;
    const btn = document.createElement("button");
    btn.type = "submit";
    btn.textContent = drain ? "Drain" : "Undrain";
    f.appendChild(btn);
    return f;
  }
  function draw(svg, series, ago) {
    const w = 300, h = 60;
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.replaceChildren();
    let max = 0;
    for (const s of series) for (const v of s) if (v !== null && v > max) max = v;
    // The x axis spans what the ring holds (10 minutes once full), at least a minute.
    const span = Math.max(60000, ago.length ? ago[0] : 0);
    series.forEach((s, k) => {
      const pts = [];
      s.forEach((v, i) => {
        if (v === null) return;
        const x = w - (ago[i] / span) * w, y = h - 2 - (max > 0 ? v / max : 0) * (h - 4);
        pts.push(x.toFixed(1) + "," + y.toFixed(1));
      });
      const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
      line.setAttribute("points", pts.join(" "));
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", k === 0 ? "var(--a)" : "var(--b)");
      line.setAttribute("stroke-width", "1.5");
      line.setAttribute("vector-effect", "non-scaling-stroke");
      svg.appendChild(line);
    });
    svg.parentNode.querySelector(".max").textContent = "max " + (max >= 100 ? max.toFixed(0) : max.toFixed(2));
  }
  function render(s) {
    const o = s.overall;
    $("c-req").textContent = fix(o.requests_s, 2);
    $("c-tin").textContent = fix(o.tokens_in_s, 1);
    $("c-tout").textContent = fix(o.tokens_out_s, 1);
    $("c-4xx").textContent = fix(o.errors_4xx_s, 2);
    $("c-5xx").textContent = fix(o.errors_5xx_s, 2);
    $("c-ttft").textContent = pair(o.ttft_p50_ms, o.ttft_p99_ms);
    $("c-dur").textContent = pair(o.duration_p50_ms, o.duration_p99_ms);
    $("c-total").textContent = String(o.totals.requests);
    $("c-inflight").textContent = String(s.inflight);
    fill("groups", [trafficCells("all", o)].concat(s.groups.map((g) => trafficCells(g.name, g))));
    fill("dialects", [Object.keys(s.dialects).map((d) => String(s.dialects[d]))]);
    fill("backends", s.backends.map((b) => [b.url, b.state + (b.probation ? " (probation)" : ""), String(b.inflight),
      fix(b.requests_s, 2), fix(b.errors_5xx_s, 2), fix(b.failures_s, 2), String(b.answers), String(b.failures),
      fix(b.running, 0), fix(b.waiting, 0), pct(b.kv_cache_usage),
      b.last_change ? b.last_change + " " + when(b.last_change_unix_ms) : "", drainButton(b)]));
    for (const tr of $("backends").children) tr.children[1].className = tr.children[1].textContent.split(" ")[0];
    fill("keys", s.keys.map((k) => [k.id, fix(k.requests_s, 2), fix(k.tokens_s, 1), String(k.requests),
      String(k.tokens_in), String(k.tokens_out), k.tokens_per_minute ? k.tokens_remaining + " / " + k.tokens_per_minute : "\u2013",
      k.requests_per_minute ? k.requests_remaining + " / " + k.requests_per_minute : "\u2013",
      String(k.daily_tokens_used) + (k.daily_tokens_limit ? " / " + k.daily_tokens_limit : ""),
      String(k.monthly_tokens_used) + (k.monthly_tokens_limit ? " / " + k.monthly_tokens_limit : ""),
      String(k.queued), fix(k.queued_ms_mean, 0), fix(k.weight, 2) + " / " + k.priority]));
    fill("shards", s.shards.map((x) => [String(x.shard), String(x.loop_iterations), fix(x.loop_iterations_s, 0),
      String(x.cqes), String(x.polls_caught), String(x.polls_missed), String(x.connections_open), bytes(x.memory_bytes)]));
    const ss = s.series.overall, ago = s.series.ms_ago;
    draw($("g-req"), [ss.requests_s], ago);
    draw($("g-tok"), [ss.tokens_in_s, ss.tokens_out_s], ago);
    draw($("g-err"), [ss.errors_4xx_s, ss.errors_5xx_s], ago);
    draw($("g-ttft"), [ss.ttft_p50_ms, ss.ttft_p99_ms], ago);
    draw($("g-dur"), [ss.duration_p50_ms, ss.duration_p99_ms], ago);
    $("updated").textContent = "up " + s.uptime_s + " s \u00b7 updated " + when(s.unix_ms);
  }
  async function poll() {
    if (locked && !tokenBox.value) return;
    try {
      const r = await fetch("/status.json", { headers: auth(), cache: "no-store" });
      if (r.status === 401) { $("note").textContent = "This gateway wants its admin token: enter it above."; return; }
      if (!r.ok) { $("note").textContent = "GET /status.json: HTTP " + r.status; return; }
      render(await r.json());
      $("note").textContent = "";
    } catch (e) {
      $("note").textContent = "The gateway does not answer (" + e.message + ").";
    }
  }
  document.addEventListener("submit", async (e) => {
    const f = e.target;
    if (!f.dataset.op) return;
    e.preventDefault();
    const r = await fetch("/backends/" + f.dataset.op + "?url=" + encodeURIComponent(f.dataset.url),
                          { method: "POST", headers: auth() });
    $("note").textContent = r.ok ? "" : f.dataset.op + " " + f.dataset.url + ": HTTP " + r.status;
    poll();
  });
  poll();
  setInterval(poll, 2000);
})();
</script>
</body></html>
)html";

void put_fixed(std::string& out, double v, int digits) {
  if (v < 0) {
    out += "&ndash;";
    return;
  }
  fmt::format_to(std::back_inserter(out), "{:.{}f}", v, digits);
}

void put_ms(std::string& out, double v) {
  if (v < 0) {
    out += "&ndash;";
  } else if (v >= 1000) {
    fmt::format_to(std::back_inserter(out), "{:.2f} s", v / 1000);
  } else {
    fmt::format_to(std::back_inserter(out), "{:.1f} ms", v);
  }
}

void card(std::string& out, const char* id, const char* label, const std::string& value) {
  fmt::format_to(std::back_inserter(out), "<div class=\"card\"><b id=\"{}\">{}</b><span>{}</span></div>\n", id, value,
                 label);
}

std::string fixed(double v, int digits) {
  std::string s;
  put_fixed(s, v, digits);
  return s;
}

// "37.5 / 49.8 ms" (the card's width takes one unit, not two).
std::string latency_pair(double p50, double p99) {
  if (p50 < 0 || p99 < 0) return "&ndash;";
  if (std::max(p50, p99) >= 1000) return fmt::format("{:.2f} / {:.2f} s", p50 / 1000, p99 / 1000);
  return fmt::format("{:.1f} / {:.1f} ms", p50, p99);
}

void traffic_tr(std::string& out, std::string_view name, const traffic_row& r) {
  out += "<tr><td>";
  put_html_escaped(out, name);
  out += "</td>";
  for (const auto& [v, d] : {std::pair{r.requests_s, 2}, {r.tokens_in_s, 1}, {r.tokens_out_s, 1}, {r.errors_4xx_s, 2},
                             {r.errors_5xx_s, 2}}) {
    out += "<td>";
    put_fixed(out, v, d);
    out += "</td>";
  }
  for (double v : {r.ttft_p50_ms, r.ttft_p99_ms, r.duration_p50_ms, r.duration_p99_ms}) {
    out += "<td>";
    put_ms(out, v);
    out += "</td>";
  }
  fmt::format_to(std::back_inserter(out), "<td>{}</td></tr>\n", r.requests);
}

void backend_tr(std::string& out, const backend_row& b) {
  auto it = std::back_inserter(out);
  out += "<tr><td>";
  put_html_escaped(out, b.url);
  out += "</td><td class=\"";
  put_html_escaped(out, b.state);
  out += "\">";
  put_html_escaped(out, b.state);
  if (b.probation) out += " (probation)";
  fmt::format_to(it, "</td><td>{}</td><td>", b.inflight);
  put_fixed(out, b.requests_s, 2);
  out += "</td><td>";
  put_fixed(out, b.errors_5xx_s, 2);
  out += "</td><td>";
  put_fixed(out, b.failures_s, 2);
  fmt::format_to(it, "</td><td>{}</td><td>{}</td><td>", b.answers, b.failures);
  put_fixed(out, b.running, 0);
  out += "</td><td>";
  put_fixed(out, b.waiting, 0);
  out += "</td><td>";
  if (b.kv_cache < 0) {
    out += "&ndash;";
  } else {
    fmt::format_to(it, "{:.0f}%", b.kv_cache * 100);
  }
  out += "</td><td>";
  put_html_escaped(out, b.last_change);
  const bool drain = b.state != "draining";
  const char* op = drain ? "drain" : "undrain";
  fmt::format_to(it, "</td><td><form method=\"post\" action=\"/backends/{}?url=", op);
  std::string q;
  put_query_escaped(q, b.url);
  put_html_escaped(out, q);
  fmt::format_to(it, "&amp;then=page\" data-op=\"{}\" data-url=\"", op);
  put_html_escaped(out, b.url);
  fmt::format_to(it, "\"><button type=\"submit\">{}</button></form></td></tr>\n", drain ? "Drain" : "Undrain");
}

void key_tr(std::string& out, const key_row& k) {
  auto it = std::back_inserter(out);
  out += "<tr><td>";
  put_html_escaped(out, k.id);
  out += "</td><td>";
  put_fixed(out, k.requests_s, 2);
  out += "</td><td>";
  put_fixed(out, k.tokens_s, 1);
  fmt::format_to(it, "</td><td>{}</td><td>{}</td><td>{}</td><td>", k.requests, k.tokens_in, k.tokens_out);
  if (k.tokens_per_minute == 0) {
    out += "&ndash;";
  } else {
    fmt::format_to(it, "{} / {}", k.tokens_remaining, k.tokens_per_minute);
  }
  out += "</td><td>";
  if (k.requests_per_minute == 0) {
    out += "&ndash;";
  } else {
    fmt::format_to(it, "{} / {}", k.requests_remaining, k.requests_per_minute);
  }
  fmt::format_to(it, "</td><td>{}", k.daily_tokens_used);
  if (k.daily_tokens_limit != 0) fmt::format_to(it, " / {}", k.daily_tokens_limit);
  fmt::format_to(it, "</td><td>{}", k.monthly_tokens_used);
  if (k.monthly_tokens_limit != 0) fmt::format_to(it, " / {}", k.monthly_tokens_limit);
  fmt::format_to(it, "</td><td>{}</td><td>", k.queued);
  put_fixed(out, k.queued_ms_mean, 0);
  out += "</td><td>";
  put_fixed(out, k.weight, 2);
  fmt::format_to(it, " / {}</td></tr>\n", k.priority);
}

void chart(std::string& out, const char* id, const char* title, const char* first, const char* second) {
  fmt::format_to(std::back_inserter(out),
                 "<div class=\"chart\"><span class=\"k1\">{}</span>{}{}{} <span class=\"muted\">{} &middot; <span "
                 "class=\"max\"></span></span><svg id=\"{}\" role=\"img\" aria-label=\"{}\"></svg></div>\n",
                 first, *second ? " / <span class=\"k2\">" : "", second, *second ? "</span>" : "", title, id, title);
}

}  // namespace

void render_status_page(const status_view& v, bool with_data, std::string& out) {
  auto it = std::back_inserter(out);
  out += k_head;
  out += with_data ? "<body>\n" : "<body data-need-token=\"1\">\n";
  out += k_header;
  if (with_data) fmt::format_to(it, "up {} s", v.uptime_s);
  out += k_token;
  if (!with_data) out += "This gateway wants its admin token: enter it above (the page needs JavaScript for that).";
  out += "</p>\n<div class=\"cards\">\n";
  const traffic_row& o = v.overall;
  card(out, "c-req", "requests/s (1 min)", with_data ? fixed(o.requests_s, 2) : "&ndash;");
  card(out, "c-tin", "tokens in/s", with_data ? fixed(o.tokens_in_s, 1) : "&ndash;");
  card(out, "c-tout", "tokens out/s", with_data ? fixed(o.tokens_out_s, 1) : "&ndash;");
  card(out, "c-4xx", "4xx/s", with_data ? fixed(o.errors_4xx_s, 2) : "&ndash;");
  card(out, "c-5xx", "5xx/s", with_data ? fixed(o.errors_5xx_s, 2) : "&ndash;");
  card(out, "c-ttft", "TTFT p50 / p99", with_data ? latency_pair(o.ttft_p50_ms, o.ttft_p99_ms) : "&ndash;");
  card(out, "c-dur", "duration p50 / p99", with_data ? latency_pair(o.duration_p50_ms, o.duration_p99_ms) : "&ndash;");
  card(out, "c-total", "requests since start", with_data ? fmt::format("{}", o.requests) : "&ndash;");
  card(out, "c-inflight", "in flight now", with_data ? fmt::format("{}", v.inflight) : "&ndash;");
  out += "</div>\n<div class=\"charts\">\n";
  chart(out, "g-req", "last 10 min", "requests/s", "");
  chart(out, "g-tok", "last 10 min", "tokens in/s", "out/s");
  chart(out, "g-err", "last 10 min", "4xx/s", "5xx/s");
  chart(out, "g-ttft", "last 10 min", "TTFT p50", "p99");
  chart(out, "g-dur", "last 10 min", "duration p50", "p99");
  out += "</div>\n<h2>Traffic by group <span class=\"muted\">(rates over the last minute)</span></h2>\n"
         "<div class=\"scroll\"><table><thead><tr><th>group</th><th>req/s</th><th>tokens in/s</th><th>tokens out/s</th>"
         "<th>4xx/s</th><th>5xx/s</th><th>TTFT p50</th><th>TTFT p99</th><th>duration p50</th><th>duration p99</th>"
         "<th>requests</th></tr></thead><tbody id=\"groups\">\n";
  if (with_data) {
    traffic_tr(out, "all", o);
    for (const traffic_row& g : v.groups) traffic_tr(out, g.name, g);
  }
  out += "</tbody></table></div>\n<h2>Requests by client dialect <span class=\"muted\">(since start)</span></h2>\n"
         "<div class=\"scroll\"><table><thead><tr>";
  for (std::string_view d : metrics::dialect_names) fmt::format_to(it, "<th>{}</th>", d);
  out += "</tr></thead><tbody id=\"dialects\">\n";
  if (with_data) {
    out += "<tr>";
    for (uint64_t n : v.dialects) fmt::format_to(it, "<td>{}</td>", n);
    out += "</tr>\n";
  }
  out += "</tbody></table></div>\n<h2>Backends</h2>\n<div class=\"scroll\"><table><thead><tr><th>backend</th>"
         "<th>state</th><th>in flight</th><th>req/s</th><th>5xx/s</th><th>failures/s</th><th>answers</th>"
         "<th>failures</th><th>running</th><th>waiting</th><th>KV cache</th>"
         "<th>last change</th><th></th></tr></thead><tbody id=\"backends\">\n";
  if (with_data) {
    for (const backend_row& b : v.backends) backend_tr(out, b);
  }
  out += "</tbody></table></div>\n<h2>Keys</h2>\n<div class=\"scroll\"><table><thead><tr><th>key id</th>"
         "<th>req/s</th><th>tokens/s</th><th>requests</th><th>tokens in</th><th>tokens out</th>"
         "<th>tokens left this minute</th><th>requests left this minute</th><th>tokens today</th>"
         "<th>tokens this month</th><th>queued</th><th>mean wait ms</th><th>weight / priority</th></tr></thead>"
         "<tbody id=\"keys\">\n";
  if (with_data) {
    for (const key_row& k : v.keys) key_tr(out, k);
  }
  out += "</tbody></table></div>\n<h2>Shards</h2>\n<div class=\"scroll\"><table><thead><tr><th>shard</th>"
         "<th>loop iterations</th><th>iterations/s</th><th>completions</th><th>polls caught</th><th>polls missed</th>"
         "<th>connections</th><th>connection memory</th></tr></thead><tbody id=\"shards\">\n";
  if (with_data) {
    for (size_t i = 0; i < v.shards.size(); ++i) {
      const shard_row& s = v.shards[i];
      fmt::format_to(it, "<tr><td>{}</td><td>{}</td><td>{:.0f}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} B</td></tr>\n",
                     i, s.loop_iterations, s.loop_iterations_s, s.cqes, s.polls_caught, s.polls_missed,
                     s.connections_open, s.memory_bytes);
    }
  }
  out += "</tbody></table></div>\n";
  out += k_script;
}

}  // namespace sluice::control
