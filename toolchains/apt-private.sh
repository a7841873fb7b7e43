# shellcheck shell=bash
# Sourced, not run: apt-get with private state, shared by toolchains/setup-deps.sh (the
# aarch64 sysroot, libcoap's source, the PyTorch arm64 root) and boards/count-instructions.sh
# (QEMU's source for its plugins), so the way deb-src entries are derived lives in one place.
# Nothing here touches the host's dpkg database, its architecture list or /etc/apt.

# private_apt_opts DIR arm64|src: prints, one per line, the apt-get options of a private
# configuration in DIR that sees the host's sources as arm64 packages (arm64) or sees the
# deb-src entries in DIR/sources.list.d (src; write them with derive_deb_src_sources). Read
# them with: mapfile -t opts < <(private_apt_opts DIR arm64)
private_apt_opts() {
  local d="$1"
  mkdir -p "$d/lists/partial" "$d/archives/partial"
  local opts=(-o "Dir::State::Lists=$d/lists" -o "Dir::Cache=$d" -o "Dir::Cache::archives=$d/archives"
              -o "Dir::State::status=/dev/null" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
  if [ "$2" = arm64 ]; then
    opts+=(-o "APT::Architecture=arm64" -o "APT::Architectures::=arm64")
  else
    opts+=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$d/sources.list.d")
  fi
  printf '%s\n' "${opts[@]}"
}

# derive_deb_src_sources DIR: writes into DIR/sources.list.d/ a deb-src entry for every
# enabled deb entry of the machine's own apt sources (one-line .list files and deb822
# .sources files): same mirror, suites and components, so no mirror name lives in this
# repository. Replaces what DIR/sources.list.d held.
derive_deb_src_sources() {
  local d="$1/sources.list.d" f
  rm -rf "$d"; mkdir -p "$d"
  : > "$d/derived.list"
  if [ -f /etc/apt/sources.list ]; then
    sed -n 's/^[[:space:]]*deb\([[:space:]]\)/deb-src\1/p' /etc/apt/sources.list >> "$d/derived.list"
  fi
  for f in /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] && sed -n 's/^[[:space:]]*deb\([[:space:]]\)/deb-src\1/p' "$f" >> "$d/derived.list"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk 'BEGIN { RS = ""; ORS = "\n\n" }
         /(^|\n)Types:[^\n]*deb([ \t]|\n|$)/ && !/(^|\n)Enabled:[ \t]*no/ {
           n = split($0, L, "\n"); out = ""
           for (i = 1; i <= n; i++) {
             if (L[i] ~ /^#/) continue
             if (L[i] ~ /^Types:/) L[i] = "Types: deb-src"
             out = out L[i] "\n"
           }
           print out
         }' "$f" >> "$d/derived-$(basename "$f")"
  done
  return 0
}
