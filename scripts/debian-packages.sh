# The Debian packages Qt needs, named once (sourced by setup-env.sh; test.sh and demo.sh install them).
# Checked on Debian 12 (see the README's "Tests"); tests/reliability/test_ci_scripts.py checks that the
# libraries QtWebEngine links against come from these packages (or from what they depend on).
# offscreen widgets and pyqtgraph
QT_OFFSCREEN_DEBS="libglib2.0-0 libgl1 libxkbcommon0 libegl1 libfontconfig1 libdbus-1-3"
# a real window (xcb)
QT_WINDOW_DEBS="libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-shape0"
# QtWebEngine (the graph tab, netron): without them its tests skip and the tab shows only a message
QT_WEBENGINE_DEBS="libnspr4 libnss3 libxcomposite1 libxdamage1 libxrandr2 libxtst6 libasound2 libxkbfile1 libgbm1 libudev1"
