from spoold.main import main

main()
