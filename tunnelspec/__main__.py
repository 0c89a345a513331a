import sys

try:
    from tunnelspec.cli.main import main
except KeyboardInterrupt:  # Ctrl-C before the CLI's own handling is in place (docs/ci.md: 130)
    sys.stderr.write("ERROR: interrupted\n")
    sys.exit(130)

main()
