#pragma once
// Both readings of a parsed head, field by field: the pre-scan's index
// (head.fields()) and a walk of the same lines with no index. Every view
// must be the same bytes at the same place.
#include <doctest/doctest.h>

#include <cstddef>
#include <string_view>

#include "sluice/http/request.hpp"

// Returns: how many fields both readings gave.
template <typename Head>
size_t same_walks(const Head& h) {
  sluice::http::header a, b;
  std::string_view la, lb;
  sluice::http::header_fields indexed = h.fields(), walked(h.field_lines);
  size_t n = 0;
  for (;;) {
    const bool more = indexed.next(a, la);
    REQUIRE(more == walked.next(b, lb));
    if (!more) break;
    CAPTURE(n);
    CHECK(a.name.data() == b.name.data());
    CHECK(a.name.size() == b.name.size());
    CHECK(a.value.data() == b.value.data());
    CHECK(a.value.size() == b.value.size());
    CHECK(la.data() == lb.data());
    CHECK(la.size() == lb.size());
    ++n;
  }
  return n;
}
