// data.cpp — the KJV corpus of data.h.
#include "data.h"

#include <cctype>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "booster/io/atomic_write.h"

namespace gpt {

namespace {
const char* const kBibleCommand = "bible -f Gen1:1-Rev22:21 2>/dev/null";

std::string run_bible() {
  FILE* pipe = ::popen(kBibleCommand, "r");
  if (!pipe) throw std::runtime_error("gpt: cannot run `bible` (install the Debian package bible-kjv)");
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  int status = ::pclose(pipe);
  if (status != 0 || out.size() < 1000000)
    throw std::runtime_error("gpt: `bible -f Gen1:1-Rev22:21` failed or printed too little (" +
                             std::to_string(out.size()) + " bytes); install the Debian package bible-kjv");
  return out;
}
}  // namespace

std::string read_or_make_kjv(const std::string& path, bool write_cache) {
  if (std::filesystem::exists(path)) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    if (!in && !in.eof()) throw std::runtime_error("gpt: cannot read " + path);
    return ss.str();
  }
  std::string raw = run_bible();
  if (write_cache) {
    auto parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    booster::io::atomic_write_file(path, raw);
  }
  return raw;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text + ",") {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      cur += c;
    }
  }
  return out;
}

Corpus split_kjv(const std::string& raw, const std::vector<std::string>& val_books) {
  Corpus c;
  c.val_books = val_books;
  std::set<std::string> held(val_books.begin(), val_books.end());
  std::string train, val;
  train.reserve(raw.size());
  std::istringstream in(raw);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    // "<book><chapter>:<verse> <text>": the book is an optional leading digit plus letters.
    size_t i = 0;
    if (std::isdigit(static_cast<unsigned char>(line[0]))) i = 1;
    while (i < line.size() && std::isalpha(static_cast<unsigned char>(line[i]))) ++i;
    size_t space = line.find(' ');
    if (i == 0 || i >= line.size() || !std::isdigit(static_cast<unsigned char>(line[i])) ||
        space == std::string::npos || line.find(':', i) > space)
      throw std::invalid_argument("gpt: corpus line " + std::to_string(line_no) + " is not '<book><chapter>:<verse> <text>': " +
                                  line.substr(0, 60));
    std::string book = line.substr(0, i);
    if (c.books.empty() || c.books.back() != book) c.books.push_back(book);
    std::string& dst = held.count(book) ? val : train;
    dst.append(line, space + 1, std::string::npos);
    dst += '\n';
  }
  std::set<std::string> known(c.books.begin(), c.books.end());
  for (const auto& b : val_books) {
    if (!known.count(b)) {
      std::string list;
      for (const auto& k : c.books) list += (list.empty() ? "" : ",") + k;
      throw std::invalid_argument("gpt: unknown validation book '" + b + "'; the books are " + list);
    }
  }
  if (train.empty() || val.empty()) throw std::invalid_argument("gpt: the train or validation split is empty");
  auto to_tensor = [](const std::string& s) {
    auto t = torch::empty({static_cast<int64_t>(s.size())}, torch::kUInt8);
    std::memcpy(t.data_ptr(), s.data(), s.size());
    return t;
  };
  c.train = to_tensor(train);
  c.val = to_tensor(val);
  return c;
}

}  // namespace gpt
