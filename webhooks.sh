#!/bin/sh
# webhook-upgrade-entry-point
#
# The command existing hook files run: /webhooks.sh "<payload>", with APP_NS, APP_WORKLOAD,
# APP_CONTAINER, REPO_TYPE, NET_TYPE and MAIL_TO in the environment. The webhook runner recognises
# this file by the marker above and runs the upgrade in-process (no process is started). Run any
# other way, it hands over to the executable's upgrade mode: same inputs, output and exit status.
# In the container image /webhooks.sh is a symlink to the executable itself, so no shell is needed.
exec "${WEBHOOK_BIN:-webhook}" upgrade "$@"
