package controlplane

import (
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// WriteKubeconfig writes a kubeconfig that reaches server with a bearer token.
func WriteKubeconfig(path, server string, caPEM []byte, user, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["labcloud"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["labcloud"] = &clientcmdapi.Context{Cluster: "labcloud", AuthInfo: user}
	cfg.CurrentContext = "labcloud"
	return clientcmd.WriteToFile(*cfg, path)
}
