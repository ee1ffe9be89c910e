from verify_tuner.entry import main

main()
