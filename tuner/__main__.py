from tuner.entry import main

main()
