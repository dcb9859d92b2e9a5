#pragma once
// config: training the semantic router's classifier with fastText (cold
// path). Only config's loader and the tests include this header: it is the
// one place fastText's types appear.
#include <fasttext/fasttext.h>

#include <memory>
#include <string>
#include <vector>

#include "sluice/config/semantic.hpp"

namespace sluice::config {

// The training settings every shard and every instance share: one thread
// and a fixed seed make training deterministic, so the same examples give
// the same model, bit for bit, everywhere.
//   character trigrams (of UTF-8 characters, "<" and ">" marking a word's
//   ends): inflected English words share their stems' trigrams; each CJK
//   character is a token of its own (semantic_normalize), so "<中>" is its
//   trigram. One row per character position keeps a request's cost low
//   (1..4-grams read four times the rows for an accuracy within a point on
//   tests/data/router's evaluation set; bench/RESULTS.md).
//   word bigrams: "why does" / "translate this" carry more than either word.
//   16 dimensions and 20,000 buckets: the input matrix (~1.5 MB) stays in
//   the caches, where 32 x 100,000 (13 MB) missed them on most rows.
fasttext::Args semantic_training_args(const std::string& input_path);

// One labelled example per line ("__label__GROUP normalised text") in a
// temporary file (fastText trains from a file), trained, the file removed.
// `examples[g]` are group g's, `names[g]` its name. Throws config_error.
std::unique_ptr<fasttext::FastText> train_semantic_fasttext(const std::vector<std::string>& names,
                                                            const std::vector<std::vector<std::string>>& examples);

// The numbers of a trained (or loaded) supervised softmax model; its labels
// "__label__NAME" are mapped to the index of group NAME in `names`. Throws
// config_error (`where` prefixes the message) for a quantized model, another
// loss, or a label that names no group.
std::shared_ptr<semantic_model> semantic_model_from(const fasttext::FastText& ft, const std::vector<std::string>& names,
                                                    const std::string& where);

}  // namespace sluice::config
