from ninfer.cli import main

main()
