// Command echo is the local cluster end-to-end test's workload, pulled from
// the cluster's registry:
//
//	echo serve ADDR        answer GET / with "hello from <hostname>"
//	echo get URL           GET URL until it answers 200 (a minute at most), print the body
//	echo write PATH TEXT   write TEXT to PATH
//	echo cat PATH          print PATH
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("usage: echo serve ADDR | get URL | write PATH TEXT | cat PATH")
	}
	switch args[0] {
	case "serve":
		host, _ := os.Hostname()
		srv := &http.Server{Addr: args[1], ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "hello from %s\n", host)
		})}
		return srv.ListenAndServe()
	case "get":
		return get(args[1])
	case "write":
		if len(args) != 3 {
			return fmt.Errorf("usage: echo write PATH TEXT")
		}
		return os.WriteFile(args[1], []byte(args[2]+"\n"), 0o644)
	case "cat":
		data, err := os.ReadFile(args[1])
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(data)
		return err
	}
	return fmt.Errorf("unknown command %q", args[0])
}

// get retries until the URL answers: the Service's endpoints and DNS
// record may still be on their way.
func get(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := &http.Client{Timeout: 5 * time.Second}
	var last error
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			body, rerr := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				_, err = os.Stdout.Write(body)
				return err
			}
			err = fmt.Errorf("%s: %s %v", url, resp.Status, rerr)
		}
		last = err
		fmt.Fprintln(os.Stderr, "retrying:", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("no answer within a minute: %w", last)
}
