// A sharded Hugging Face checkpoint: large models come as several safetensors files and an index,
//   DIR/model.safetensors.index.json = {"metadata": {...}, "weight_map": {"TENSOR": "FILE", ...}}
// naming, for each tensor, the file in DIR that holds it (model-00001-of-00004.safetensors, ...).
// `train --checkpoint DIR/model.safetensors.index.json` reads such a checkpoint (engine/hf_format.h
// imports it one shard at a time; the config comes from DIR/config.json).
#pragma once
#include <map>
#include <string>
#include <vector>

namespace ul {

inline bool is_safetensors_index_path(const std::string& p) {
  const std::string ext = ".safetensors.index.json";
  return p.size() >= ext.size() && p.compare(p.size() - ext.size(), ext.size(), ext) == 0;
}

struct SafetensorsIndex {
  std::string path;                           // the index file
  std::vector<std::string> files;             // DIR/FILE of every shard, in file-name order
  std::map<std::string, size_t> file_of;      // tensor name -> its shard in files
};

// Reads and checks the index: a JSON object with a "weight_map" object of string values, at least
// one tensor, each file a plain name in the index's directory (no '/', not "." or "..", ending in
// .safetensors). Throws std::runtime_error naming the index and the problem. The shards themselves
// are opened (and checked against the map) by the importer.
SafetensorsIndex read_safetensors_index(const std::string& path);

}  // namespace ul
