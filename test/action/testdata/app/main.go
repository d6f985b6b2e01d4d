// The user's app of the Action test: it answers every request with its
// pod's name, so the test knows the answer came through the Service.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"
)

func main() {
	host, _ := os.Hostname()
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "app:ci on %s\n", host)
	})
	log.Fatal(http.ListenAndServe(":8080", nil))
}
