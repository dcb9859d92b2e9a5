#include <doctest/doctest.h>

#include "sluice/core/result.hpp"

using sluice::errc;
using sluice::result;

TEST_SUITE("core::result") {
  TEST_CASE("a result holds either a value or an error") {
    result<int> v = 42;
    CHECK(v.ok());
    CHECK(v.value() == 42);
    result<int> e = errc::bad_request;
    CHECK_FALSE(e.ok());
    CHECK(e.error() == errc::bad_request);
    CHECK(sluice::to_string(e.error()) == "bad_request");
  }
}
