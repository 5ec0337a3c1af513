from suite.gpu_check.check import main

if __name__ == "__main__":  # not in a process the predictions spawn, which imports this module again
    main()
