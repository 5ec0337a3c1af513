from suite.gpu_grid.grid import main

if __name__ == "__main__":  # not in a process the forecasts spawn, which imports this module again
    main()
