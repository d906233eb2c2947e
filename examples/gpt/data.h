// data.h — the King James Bible corpus of the gpt example, byte-level, split by whole books.
//
// Source: the Debian package bible-kjv. `bible -f Gen1:1-Rev22:21` prints one verse per line,
// "<book><chapter>:<verse> <text>" (e.g. "Ge1:1 In the beginning God created ..."); that raw output
// is cached in a file (the corpus path) and parsed here.
// Clean text form: the verse reference is stripped; each verse's text followed by '\n', in the
// Bible's order. Books keep the package's abbreviations ("Ge", "Ruth", "Eccl", "Mark", "Rom", ...).
// Split: the verses of the held-out books (whole books) form the validation stream, every other
// book the training stream; each stream is the concatenation of its books in order.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

struct Corpus {
  torch::Tensor train;                  // uint8 [N_train] bytes of the training books
  torch::Tensor val;                    // uint8 [N_val] bytes of the held-out books
  std::vector<std::string> books;       // every book abbreviation, in order
  std::vector<std::string> val_books;   // the held-out ones, as configured
};

// The raw `bible` output (see above). When `path` does not exist it runs `bible -f
// Gen1:1-Rev22:21`; if `write_cache` it then stores the output at `path` (atomically; parent
// directories created). Throws std::runtime_error when neither works (names the package to install).
std::string read_or_make_kjv(const std::string& path, bool write_cache);

// Parses the raw text and splits it. `val_books` are book abbreviations as printed by `bible`.
// Throws std::invalid_argument for a malformed line, an unknown book (listing the known ones) or an
// empty split.
Corpus split_kjv(const std::string& raw, const std::vector<std::string>& val_books);

// "a, b,c" -> {"a", "b", "c"} (empty items dropped).
std::vector<std::string> split_list(const std::string& text);

}  // namespace gpt
