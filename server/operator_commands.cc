#include "server/operator_commands.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "model/dataset.h"
#include "server/evaluator.h"
#include "server/gan_coordinator.h"
#include "server/keystore.h"
#include "server/run_end.h"
#include "server/wal_repair.h"

namespace edgetrain::server {

void declare_run_settings(settings::Table& t, ServerSettings& s) {
  t.group("Start-up and the end of the run");
  t.add("eval-data-optional", s.eval_data_optional,
        "when --eval-data's files are not there, run without evaluation "
        "(said in the log) instead of refusing to start (the packaged server.toml sets it)");
  t.add("init-from", s.init_from,
        "warm start: a NEW state directory begins with this checkpoint's parameters (same "
        "model; version 0); refused when the state directory holds another run. A plain "
        "safetensors file of the model's tensors without edgetrain.crc32 is taken with a "
        "warning (its bytes unchecked); tools/onnx_to_edgetrain.py writes sealed ones");
  t.add("stop-at-accuracy", s.stop_at_accuracy,
        "checkpoint and exit 0 once an evaluation reaches this test accuracy "
        "(needs evaluation data); 0: off")
      .range(0, 1);
  t.add("stop-after-updates", s.stop_after_updates,
        "checkpoint and exit 0 once the model's version (updates applied "
        "since the state directory began) reaches this; 0: off")
      .unit("updates");
  t.add("stop-after-seconds", s.stop_after_seconds,
        "checkpoint and exit 0 after this long serving; 0: off")
      .range(0, 1e9)
      .unit("seconds");
}

namespace {

std::string default_server_uri() {
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  return std::string("coaps://") + host + ":5684";
}

void declare_name(settings::Table& t, std::string& name) {
  t.positional("name", name, "device name = PSK identity");
}

}  // namespace

OperatorCommands::OperatorCommands(settings::Table& table) {
  add_table_ = &table.subcommand(
      "add-device",
      "add a device with a random key to the keystore and print its worker configuration");
  add_table_->positional("name", add_.name,
                         "device name = PSK identity ([A-Za-z0-9._-], up to 64)");
  add_table_->add("keystore", add_.keystore, "keystore file (created mode 0600 if missing)")
      .required();
  add_table_->add("server-uri", add_.server_uri,
                  "URI the worker should use (default coaps://<this host>:5684)");

  repair_table_ = &table.subcommand(
      "repair-wal",
      "list damage in the middle of the WAL (which stops recovery) and repair it as you choose");
  repair_table_
      ->add("state-dir", repair_.state_dir,
            "the server's state directory (the server must not be running)")
      .required();
  repair_table_->add(
      "skip-damaged", repair_.skip_damaged,
      "keep every intact record; empty placeholder updates stand in for the damaged ones");
  repair_table_->add(
      "cut-at-damage", repair_.cut_at_damage,
      "end the log before the first damaged record (drops the intact records after it)");
  repair_table_->footer(
      "Without a choice: lists wal.log, wal.prev.log and rounds.wal (federated rounds) and what "
      "each choice would do, changes nothing.\n"
      "A damaged file is kept as FILE.damaged before the repaired one replaces it.\n"
      "Exit status: 0 no damage (a torn tail alone is the server's to cut) or repaired; 3 damage "
      "found, nothing changed (choose --skip-damaged or --cut-at-damage); 1 error (unreadable "
      "file or header, a choice that cannot be carried out); 2 bad usage.");

  list_table_ = &table.subcommand(
      "list-devices", "list the keystore's devices (names; keys only with --show-keys)");
  list_table_->add("keystore", list_.keystore, "keystore file").required();
  list_table_->add("show-keys", list_.show_keys,
                   "also print each key: as text when it is printable (what "
                   "coap-client's -k takes), else as hex");
  list_table_->add("json", list_.json, "print a JSON array instead of a table");

  remove_table_ = &table.subcommand("remove-device",
                                    "remove a device from the keystore; a running server refuses "
                                    "its next request (4.03) and handshake");
  declare_name(*remove_table_, remove_.name);
  remove_table_->add("keystore", remove_.keystore, "keystore file").required();

  rotate_table_ =
      &table.subcommand("rotate-key",
                        "give a device a new key and print its new worker configuration; "
                        "the old key no longer completes a handshake");
  declare_name(*rotate_table_, rotate_.name);
  rotate_table_->add("keystore", rotate_.keystore, "keystore file").required();
  rotate_table_->add("server-uri", rotate_.server_uri,
                     "URI the worker should use (default coaps://<this host>:5684)");

  evaluate_table_ =
      &table.subcommand("evaluate",
                        "test accuracy and loss of a checkpoint file on a data set's test "
                        "split");
  evaluate_table_->positional("checkpoint", evaluate_.checkpoint,
                              "checkpoint file (checkpoint.safetensors, "
                              "best.safetensors, ...)");
  evaluate_table_
      ->add("data", evaluate_.data, "test set: mnist, mnist-small, fashion-mnist or a directory")
      .required();
  evaluate_table_->add("model", evaluate_.model,
                       "model name or spec (default: the one the checkpoint names)");
  evaluate_table_->add("json", evaluate_.json,
                       "print one JSON object (checkpoint, model, version, data, images, "
                       "accuracy, loss) instead of a line");
}

std::optional<int> OperatorCommands::run() const {
  if (add_table_->parsed()) return add_device();
  if (repair_table_->parsed()) return repair_wal();
  if (list_table_->parsed()) return list_devices();
  if (remove_table_->parsed()) return remove_device();
  if (rotate_table_->parsed()) return rotate_key();
  if (evaluate_table_->parsed()) return evaluate();
  return std::nullopt;
}

int OperatorCommands::add_device() const {
  const std::string uri = add_.server_uri.empty() ? default_server_uri() : add_.server_uri;
  const auto key = server::add_device(add_.keystore, add_.name);
  std::cout << worker_config_toml(uri, add_.name, key);
  log_line("added '" + add_.name + "' to " + add_.keystore);
  return 0;
}

// repair-wal without a choice found damage; nothing changed.
constexpr int kDamageFound = 3;

int OperatorCommands::repair_wal() const {
  const RepairWal& r = repair_;
  if (r.skip_damaged && r.cut_at_damage) {
    std::cerr << "edgetrain-server repair-wal: choose one of --skip-damaged and --cut-at-damage\n";
    return 2;
  }
  const auto choice = r.skip_damaged    ? WalRepairChoice::kSkipDamaged
                      : r.cut_at_damage ? WalRepairChoice::kCutAtDamage
                                        : WalRepairChoice::kListOnly;
  if (!std::filesystem::exists(std::filesystem::path(r.state_dir) / "wal.log"))
    throw std::runtime_error("no wal.log in " + r.state_dir +
                             ": not a state directory of edgetrain-server");
  bool damage_left = false;
  // secagg.wal needs no repair: one that does not replay begins the round's next attempt.
  for (const char* name : {"wal.log", "wal.prev.log", "rounds.wal", "gan/gan.wal"}) {
    const std::filesystem::path path = std::filesystem::path(r.state_dir) / name;
    if (!std::filesystem::exists(path)) continue;
    const WalRepairResult result =
        server::repair_wal(path, choice, name == std::string_view("gan/gan.wal") ? gan_wal_placeholder() : WalPlaceholder{});
    for (const std::string& line : result.report) std::cout << line << '\n';
    // What was changed also goes to the log (stderr), with the time, like the server's own lines.
    if (result.changed)
      for (const std::string& line : result.report) log_line("repair-wal: " + line);
    damage_left = damage_left || (result.damaged && !result.changed);
  }
  return damage_left ? kDamageFound : 0;
}

int OperatorCommands::list_devices() const {
  const Keystore keystore = Keystore::load(list_.keystore);
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& [name, key] : keystore.devices()) {
    const bool printable = is_printable_key(key);
    nlohmann::json device{{"name", name}, {"key_bytes", key.size()}, {"printable", printable}};
    if (list_.show_keys) {
      if (printable) device["key"] = std::string(key.begin(), key.end());
      device["key_hex"] = to_hex(key);
    }
    devices.push_back(std::move(device));
  }
  if (list_.json) {
    std::cout << devices.dump(2) << '\n';
    return 0;
  }
  for (const auto& device : devices) {
    std::cout << device["name"].get<std::string>() << '\t' << device["key_bytes"].get<std::size_t>()
              << " bytes\t"
              << (device["printable"].get<bool>()
                      ? "printable"
                      : "binary (not usable with coap-client: rotate-key)");
    if (list_.show_keys)
      std::cout << '\t'
                << (device.contains("key") ? device["key"].get<std::string>()
                                           : "hex " + device["key_hex"].get<std::string>());
    std::cout << '\n';
  }
  return 0;
}

int OperatorCommands::remove_device() const {
  server::remove_device(remove_.keystore, remove_.name);
  log_line("removed '" + remove_.name + "' from " + remove_.keystore);
  return 0;
}

int OperatorCommands::rotate_key() const {
  const auto key = server::rotate_key(rotate_.keystore, rotate_.name);
  std::cout << worker_config_toml(
      rotate_.server_uri.empty() ? default_server_uri() : rotate_.server_uri, rotate_.name, key);
  log_line("new key for '" + rotate_.name + "' in " + rotate_.keystore +
           "; the old one no longer works");
  return 0;
}

int OperatorCommands::evaluate() const {
  const CheckpointFile checkpoint = read_checkpoint_file(evaluate_.checkpoint, evaluate_.model);
  const runtime::Dataset test =
      runtime::load_named_dataset(evaluate_.data, runtime::DataSplit::kTest);
  const EvaluationResult result =
      evaluate_parameters(checkpoint.model, checkpoint.model.parameters(), test);
  if (evaluate_.json) {
    std::cout << nlohmann::json{{"checkpoint", evaluate_.checkpoint},
                                {"model", checkpoint.model.spec().name},
                                {"version", checkpoint.version},
                                {"data", evaluate_.data},
                                {"images", test.size()},
                                {"accuracy", result.accuracy},
                                {"loss", result.loss}}
                     .dump()
              << '\n';
    return 0;
  }
  char line[256];
  std::snprintf(line, sizeof(line),
                "test accuracy %.4f, loss %.4f on %zu images of %s (model %s, version %llu)\n",
                result.accuracy, result.loss, test.size(), evaluate_.data.c_str(),
                checkpoint.model.spec().name.c_str(),
                static_cast<unsigned long long>(checkpoint.version));
  std::cout << line;
  return 0;
}

}  // namespace edgetrain::server
