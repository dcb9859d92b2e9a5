#pragma once
// config (private): value parsers load() uses that are not part of the
// public API (values.cpp).
#include <array>
#include <memory>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config/config.hpp"

namespace sluice::config {

// A backend URL, checked and normalized, before resolution.
struct parsed_url {
  backend_transport transport = backend_transport::http1;
  std::string normalized;  // "http://host:port", "grpc://host:port"
  std::string host;        // without brackets, for getaddrinfo
  std::string port;
  std::string host_header; // "host:port", brackets kept for IPv6
};

// Throws config_error naming the URL and what is allowed.
parsed_url parse_backend_url(std::string_view url);

// Cold path: getaddrinfo may block on DNS; it runs once per backend at load.
// Throws config_error when the host does not resolve.
socket_address resolve(const parsed_url& u);

// 64 hex digits into 32 bytes. Returns: false for anything else.
bool parse_hex_digest(std::string_view hex, std::array<uint8_t, 32>& out);

// `path` as written in the config file `source`: a relative path is taken
// from the file's folder (from the working directory for "<embedded ...>").
std::string relative_to(std::string_view source, const std::string& path);

// An examples file: one prompt per line; blank lines and lines starting with
// '#' (after spaces) skipped; CRLF taken. A regular file of at most 16 MiB
// (a device or a FIFO would never end). Throws config_error (no location).
std::vector<std::string> read_examples_file(const std::string& path);

// semantic = "classifier": the model of [router] model_file, or one trained
// on the groups' examples (semantic.cpp). `where` is the [router] table's
// "FILE:LINE". Throws config_error.
std::shared_ptr<const semantic_model> build_semantic_model(const config& cfg, const std::string& where);

// semantic = "embeddings" (embeddings.cpp): checks router.embeddings_group
// and resolves its index; makes the snapshot's centroid slot. Throws
// config_error.
void resolve_embeddings_group(config& cfg, const std::string& where);

// Edit distance, for "did you mean" hints (short names: O(n*m)).
size_t edit_distance(std::string_view a, std::string_view b);
// '*' matches any run of characters, '?' one character (key groups).
bool glob_match(std::string_view pattern, std::string_view text);
// A name fit for metrics labels and audit records (no escaping anywhere).
bool is_plain_name(std::string_view s);

}  // namespace sluice::config
