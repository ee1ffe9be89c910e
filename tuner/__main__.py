from verify_tuner.cli.entry import main

main()
