// Tools module: a registry with the OCI 1.1 referrers API for the signature tests. Never imported by
// the product. go-containerregistry's own cmd/registry serves its in-memory registry without the
// referrers API (an option it does not set) and without TLS; this main sets both.
module webhook.test/oci-registry

go 1.26.0

require github.com/google/go-containerregistry v0.22.1
