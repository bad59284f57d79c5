// Command oci-registry serves go-containerregistry's in-memory registry with the OCI 1.1 referrers API
// (GET /v2/<name>/referrers/<digest>) over TLS on 127.0.0.1, for the signature tests
// (test/oci-registry.ts). It prints "serving on port N" once it listens.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	cert := flag.String("cert", "", "PEM certificate file")
	key := flag.String("key", "", "PEM key file")
	flag.Parse()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("serving on port %d\n", listener.Addr().(*net.TCPAddr).Port)
	server := &http.Server{
		// A test's requests take milliseconds; this only keeps a stuck client from holding a connection.
		ReadHeaderTimeout: 5 * time.Second,
		Handler:           registry.New(registry.WithReferrersSupport(true)),
	}
	log.Fatal(server.ServeTLS(listener, *cert, *key))
}
