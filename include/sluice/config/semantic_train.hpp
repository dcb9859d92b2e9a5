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
//   character n-grams of 1..4 UTF-8 characters: Chinese has no spaces, so a
//   sentence is one "word" and its characters and short runs carry the
//   meaning; inflected English words share their stems' n-grams.
//   word bigrams: "why does" / "translate this" carry more than either word.
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
