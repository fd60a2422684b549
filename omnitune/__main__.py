from omnitune.cli import main

main()
