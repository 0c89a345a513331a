from tunnelspec.cli import main

main()
