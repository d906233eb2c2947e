// metrics_csv.h — the examples' metrics.csv on resume: a resumed run keeps the rows of the part it
// does not repeat.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace examples {

// The data rows (header excluded, each with its newline) of the CSV file `path` whose first column,
// read as an integer (the epoch or the step), is below `limit`; "" when the file is missing.
inline std::string metrics_rows_below(const std::string& path, int64_t limit) {
  std::ifstream in(path);
  std::string line, kept;
  bool header = true;
  while (std::getline(in, line)) {
    if (header) {
      header = false;
      continue;
    }
    std::istringstream row(line);
    int64_t first = 0;
    if (row >> first && first < limit) kept += line + "\n";
  }
  return kept;
}

}  // namespace examples
