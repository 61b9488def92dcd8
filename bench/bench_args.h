// The benchmarks' command lines: "--name value" (or "--name=value") and bare switches, read as the
// program asks for each one, the values parsed as train's flags are (engine/options.h). --help (or
// -h) prints the program's usage and exits 0; a flag the program never asked for, a value missing,
// a switch given a value, or a number that does not parse whole is an error naming the flag, with
// the usage, and exit status 2, before anything is measured.
//   BenchArgs args(argc, argv, "usage: bench_x [--reps 5] [--profile]");
//   const int reps = args.positive("--reps", 5);   // an int >= 1
//   const bool profile = args.flag("--profile");
//   args.done();  // after the last read: unknown flags are errors
#pragma once
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/float_env.h"
#include "engine/options.h"

class BenchArgs {
 public:
  BenchArgs(int argc, char** argv, std::string usage) : prog_(argc > 0 ? argv[0] : "bench"), usage_(std::move(usage)) {
    ul::flush_subnormals();  // as train computes (engine/float_env.h): first in main, before any thread
    for (int i = 1; i < argc; i++) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::printf("%s\n", usage_.c_str());
        std::exit(0);
      }
      if (a.size() < 3 || a.compare(0, 2, "--") != 0) fail("unexpected argument '" + a + "'");
      Arg arg{a, "", false, false};
      const size_t eq = a.find('=');
      if (eq != std::string::npos) {
        arg.name = a.substr(0, eq);
        arg.value = a.substr(eq + 1);
        arg.has_value = true;
      } else if (i + 1 < argc && std::string(argv[i + 1]).compare(0, 2, "--") != 0) {
        // The next word is this flag's value unless it is a flag itself ("-1" is a value).
        arg.value = argv[++i];
        arg.has_value = true;
      }
      args_.push_back(arg);
    }
  }

  bool flag(const char* name) {  // a bare switch
    Arg* a = find(name);
    if (a && a->has_value) fail(std::string(name) + " takes no value (got '" + a->value + "')");
    return a != nullptr;
  }
  std::string text(const char* name, const std::string& def) {
    Arg* a = find(name);
    return a ? value(*a) : def;
  }
  // One of `choices` (the default is not checked): a value outside them ran as something else.
  std::string choice(const char* name, const std::string& def, const std::vector<std::string>& choices) {
    const std::string v = text(name, def);
    if (v == def) return v;
    for (const std::string& c : choices)
      if (v == c) return v;
    std::string all;
    for (const std::string& c : choices) all += (all.empty() ? "" : " or ") + c;
    fail(std::string(name) + ": expected " + all + ", got '" + v + "'");
  }
  [[noreturn]] void refuse(const std::string& msg) { fail(msg); }  // a combination of flags
  bool given(const char* name) {  // whether a value flag is on the command line (it stays unread)
    for (const Arg& a : args_)
      if (a.name == name) return true;
    return false;
  }
  // An integer in [lo, hi] (the default is not checked).
  long integer(const char* name, long def, long lo = LONG_MIN, long hi = LONG_MAX) {
    Arg* a = find(name);
    return a ? in_range(name, parsed(ul::parse_int, name, value(*a)), lo, hi) : def;
  }
  int positive(const char* name, int def) { return int(integer(name, def, 1, INT_MAX)); }  // a count, >= 1
  double real(const char* name, double def) {  // a finite number > 0
    Arg* a = find(name);
    if (!a) return def;
    const double v = parsed(ul::parse_float, name, value(*a));
    if (!(v > 0) || !std::isfinite(v)) fail(std::string(name) + " must be a finite number > 0, got " + value(*a));
    return v;
  }
  double bytes(const char* name, double def) {  // "24G", "512M", ...
    Arg* a = find(name);
    return a ? parsed(ul::parse_bytes, name, value(*a)) : def;
  }
  std::vector<int> ints(const char* name, const std::vector<int>& def, int lo = INT_MIN) {  // "a,b,c", each >= lo
    Arg* a = find(name);
    if (!a) return def;
    std::vector<int> out;
    std::stringstream in(value(*a));
    for (std::string x; std::getline(in, x, ',');)
      out.push_back(int(in_range(name, parsed(ul::parse_int, name, x), lo, INT_MAX)));
    if (out.empty()) fail(std::string(name) + " wants a comma-separated list of integers");
    return out;
  }
  void done() {  // every flag given must have been read by now
    for (const Arg& a : args_)
      if (!a.used) fail("unknown flag " + a.name);
  }

 private:
  struct Arg {
    std::string name, value;
    bool has_value, used;
  };
  Arg* find(const char* name) {  // the last occurrence wins
    Arg* hit = nullptr;
    for (Arg& a : args_)
      if (a.name == name) {
        a.used = true;
        hit = &a;
      }
    return hit;
  }
  std::string value(const Arg& a) {
    if (!a.has_value) fail(a.name + " needs a value");
    return a.value;
  }
  template <class R> R parsed(R (*parse)(const std::string&, const std::string&), const char* name, const std::string& v) {
    try {
      return parse(name, v);
    } catch (const std::runtime_error& e) {
      fail(e.what());
    }
  }
  long in_range(const char* name, long x, long lo, long hi) {
    if (x < lo) fail(std::string(name) + " must be >= " + std::to_string(lo) + ", got " + std::to_string(x));
    if (x > hi) fail(std::string(name) + " must be <= " + std::to_string(hi) + ", got " + std::to_string(x));
    return x;
  }
  [[noreturn]] void fail(const std::string& msg) {
    std::fprintf(stderr, "%s: %s\n%s\n", prog_.c_str(), msg.c_str(), usage_.c_str());
    std::exit(2);
  }

  std::string prog_, usage_;
  std::vector<Arg> args_;
};
