#!/bin/bash
# The upgrade script of the image this project replaces (adnanh/webhook + bash + jq + kubectl),
# re-created from its documented behaviour so that `npm run bench:burst` can run the old stack
# beside ours. Per push it makes the calls the old /webhooks.sh made: jq for each payload field,
# kubectl get of the workload (container check and current image, read with jq), kubectl set image
# (or, for the same image, a patch of imagePullPolicy and a restart annotation), and, when the hook
# passes MAIL_TO, the pod details ten seconds later (kubectl get pods, kubectl describe pod of each
# pod whose name contains the workload's) for the result mail. Its known faults are kept where a
# push of the benchmark does not reach them (the unquoted payload echo, the case-insensitive
# substring match of the container, Docker Hub's `/` for `:`, exit status always 0); the shared
# temporary files of the original are not, so that concurrent pushes do not corrupt each other.
#
# Inputs as the seed hook passes them: $1 = the payload; APP_NS, APP_WORKLOAD (<kind>/<name>),
# APP_CONTAINER, REPO_TYPE, NET_TYPE, MAIL_TO. The mail itself is sent only when MAIL_SMTP_SERVER
# is set (base64, as in the old image), over implicit TLS with curl.

payload=$1

# 1. Docker Hub's test ping (sent when a webhook is created) lacks these: nothing to do.
tag=$(echo $payload | jq -r '.push_data.tag // empty')
repo_name=$(echo $payload | jq -r '.repository.name // empty')
repo_namespace=$(echo $payload | jq -r '.repository.namespace // empty')
if [ -z "$tag" ] || [ -z "$repo_name" ] || [ -z "$repo_namespace" ]; then
  echo "not an image push: nothing to do"
  exit 0
fi

# 2. The workload must have the container; its current image.
workload=$(kubectl -n "$APP_NS" get "$APP_WORKLOAD" -o json)
if ! echo "$workload" | jq -r '.spec.template.spec.containers[].name' | grep -qi "$APP_CONTAINER"; then
  echo "container $APP_CONTAINER not found in $APP_NS/$APP_WORKLOAD"
  exit 0
fi
image_before=$(echo "$workload" | jq -r --arg c "$APP_CONTAINER" '.spec.template.spec.containers[] | select(.name == $c) | .image')

# 3. The new image reference.
case $REPO_TYPE in
  regionalregistry)
    region=$(echo $payload | jq -r '.repository.region')
    full_name=$(echo $payload | jq -r '.repository.repo_full_name')
    case $NET_TYPE in
      vpc) host=registry-vpc.$region.aliyuncs.com ;;
      internal) host=registry-internal.$region.aliyuncs.com ;;
      *) host=registry.$region.aliyuncs.com ;;
    esac
    image_after=$host/$full_name:$tag
    ;;
  publicregistry)
    image_after=$(echo $payload | jq -r '.repository.repo_name')/$tag
    ;;
  custom)
    repo_url=$(echo $payload | jq -r '.repository.repo_url')
    image_after=$repo_url/$repo_namespace/$repo_name:$tag
    ;;
esac

# 4. A different image is set; the same one is pulled again by restarting the pods.
if [ "$image_after" != "$image_before" ]; then
  result=$(kubectl -n "$APP_NS" set image "$APP_WORKLOAD" "$APP_CONTAINER=$image_after" 2>&1)
else
  stamp=$(date +%s)
  patch='{"spec":{"template":{"metadata":{"annotations":{"webhooks/updateTimestamp":"'$stamp'"}},'
  patch=$patch'"spec":{"containers":[{"name":"'$APP_CONTAINER'","imagePullPolicy":"Always"}]}}}}'
  result=$(kubectl -n "$APP_NS" patch "$APP_WORKLOAD" -p "$patch" 2>&1)
fi
echo "container:    $APP_CONTAINER"
echo "image before: $image_before"
echo "image after:  $image_after"
echo "result:       $result"

# 5. The result mail, with the pods as they are ten seconds later.
if [ -n "$MAIL_TO" ]; then
  sleep 10
  name=${APP_WORKLOAD#*/}
  pods=""
  for pod in $(kubectl -n "$APP_NS" get pods -o name | grep "$name"); do
    pods="$pods$(kubectl -n "$APP_NS" describe "$pod")
"
  done
  if [ -n "$MAIL_SMTP_SERVER" ]; then
    server=$(echo "$MAIL_SMTP_SERVER" | base64 -d)
    from=$(echo "$MAIL_FROM" | base64 -d)
    password=$(echo "$MAIL_PASSWORD" | base64 -d)
    printf 'From: %s\r\nTo: %s\r\nSubject: Webhooks通知: %s-%s-%s 更新结果\r\nDate: %s\r\n\r\n%s\r\n%s\r\n%s\r\n%s\r\n%s\r\n' \
      "$from" "$MAIL_TO" "$APP_NS" "$name" "$APP_CONTAINER" "$(date)" "$APP_CONTAINER" "$image_before" \
      "$image_after" "$result" "$pods" |
      curl -s --url "smtps://$server:${MAIL_SMTP_PORT:-465}" --mail-from "$from" --mail-rcpt "$MAIL_TO" \
        --user "$from:$password" --upload-file - >/dev/null
  fi
fi
exit 0
