#pragma once
// Test helper: a test binary that links alloc_counter.cpp replaces the
// global operator new/delete and counts every allocation, so a test can
// show that a hot path does not call the allocator once warm (STYLE.md §4).
// The tests that use it are single-threaded.
#include <cstddef>

namespace sluice::test {
size_t allocations() noexcept;
}  // namespace sluice::test
