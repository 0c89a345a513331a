"""Whether a built llama-server serves TLS: `--help` lists `--ssl-key-file` in every build, with or
without OpenSSL (a build without it only fails at start, "built without SSL support"), so the
binary itself is asked. Its server code carries one of two messages, chosen at compile time by
CPPHTTPLIB_OPENSSL_SUPPORT: "running with SSL" (b9093: "Running with SSL") when it has TLS, "built
without SSL support" when not. They live in llama-server or, in shared builds, in a library beside it
(libllama-server-impl.so in b11434). Neither message found: a binary linking libssl has TLS."""

from __future__ import annotations

# Argument: the llama-server binary. Prints "tls yes", "tls no" or "tls unknown" and the file.
PROBE = r"""
bin=$1; dir=$(dirname -- "$bin")
[ -x "$bin" ] || { echo "tls missing $bin"; exit 0; }
for f in "$bin" "$dir"/lib*server*.so* "$dir"/lib*httplib*.so*; do
  [ -f "$f" ] || continue
  if grep -a -q -i -F 'running with SSL' -- "$f"; then echo "tls yes $f"; exit 0; fi
  if grep -a -q -i -F 'built without SSL support' -- "$f"; then echo "tls no $f"; exit 0; fi
done
# Neither message (another layout): linking libssl is the evidence left.
if ldd -- "$bin" 2>/dev/null | grep -q 'libssl\.so'; then echo "tls yes $bin (links libssl)"; exit 0; fi
echo "tls unknown $bin"
"""

NO_TLS = ("built without TLS (OpenSSL): the build on main found no OpenSSL headers (libssl-dev) or "
          "LLAMA_OPENSSL was off when it was configured")


def probe_argv(binary: str) -> list[str]:
    return ["sh", "-c", PROBE, "sh", binary]


def parse(stdout: str) -> str:
    """'yes', 'no', 'unknown' or 'missing'."""
    for line in stdout.splitlines():
        parts = line.split(" ", 2)
        if len(parts) >= 2 and parts[0] == "tls":
            return parts[1]
    return "unknown"
