#include "engine/hf_index.h"

#include <filesystem>
#include <iterator>
#include <set>
#include <stdexcept>

#include "engine/file_io.h"
#include "engine/hf_format.h"
#include "engine/json.h"

namespace ul {

SafetensorsIndex read_safetensors_index(const std::string& path) {
  auto bad = [&](const std::string& why) { return std::runtime_error(path + ": " + why); };
  // An index entry ("model.layers.0.mlp.up_proj.weight": "model-00001-of-00004.safetensors") is
  // 30 bytes or more a value: a bound at a sixteenth of the size in values keeps a hostile file's
  // parse within 7 times its size.
  const std::string text = read_whole_file(path);
  const JsonValue root = parse_json(text, path, text.size() / 16 + 1024);
  if (!root.is(JsonValue::Kind::object)) throw bad("not a JSON object");
  const JsonValue* map = root.find("weight_map");
  if (!map || !map->is(JsonValue::Kind::object)) throw bad("no \"weight_map\" object (not a safetensors index)");
  if (map->fields.empty()) throw bad("the weight_map names no tensor");
  SafetensorsIndex idx;
  idx.path = path;
  std::set<std::string> names;
  for (const auto& [tensor, file] : map->fields) {
    if (!file.is(JsonValue::Kind::string)) throw bad("weight_map: the file of '" + tensor + "' is not a string");
    const std::string& f = file.text;
    if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos || f == "." || f == ".." ||
        !is_safetensors_path(f))
      throw bad("weight_map: '" + f + "' (for '" + tensor + "') is not a .safetensors file name in the index's directory");
    names.insert(f);
  }
  const std::string dir = hf_dir_of(path);
  idx.files.assign(names.begin(), names.end());
  for (std::string& f : idx.files) {
    f = dir + "/" + f;
    // Every shard before the first is read: a missing last one was found after minutes of loading.
    if (!std::filesystem::is_regular_file(f)) throw bad("weight_map names " + f + ", which is not there");
  }
  for (const auto& [tensor, file] : map->fields)
    idx.file_of[tensor] = size_t(std::distance(names.begin(), names.find(file.text)));
  return idx;
}

}  // namespace ul
