"""The leaderboard: trial results as one self-contained HTML page, opened from disk in a browser.

- `page`: the page (template, style, script and data inlined) from analysis's frames.
- `callback`: a Hydra callback that writes the page when a sweep ends (the CPU demo's last step).
- page.html, page.css, page.js: the page itself; page.js draws the table, filters and SVG plots.
"""
