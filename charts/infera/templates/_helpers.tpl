{{/* Names, labels and images shared by the templates. */}}

{{/* <release>-infera, or the release name alone when it already says infera. */}}
{{- define "infera.fullname" -}}
{{- if contains "infera" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-infera" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "infera.operatorName" -}}
{{- printf "%s-operator" (include "infera.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "infera.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "infera.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The labels of every object. The chart's version may carry build metadata
(Flux's `reconcileStrategy: Revision` makes it `<version>+<commit>`); a label value
cannot hold `+`. */}}
{{- define "infera.labels" -}}
{{ include "infera.podLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The labels of pod templates: none that changes with the chart's or the app's
version, so an upgrade that changes nothing else of a pod (or a GitOps tool rebuilding
the chart on every commit) restarts no etcd, NATS or operator pod. */}}
{{- define "infera.podLabels" -}}
app.kubernetes.io/part-of: infera
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "infera.tag" -}}
{{- default .Chart.AppVersion .Values.image.tag -}}
{{- end -}}

{{/* infera.image: the image of part `.part`, unless `.override` is set. */}}
{{- define "infera.image" -}}
{{- if .override -}}
{{- .override -}}
{{- else -}}
{{- printf "%s/infera-%s:%s" (trimSuffix "/" .root.Values.image.registry) .part (include "infera.tag" .root) -}}
{{- end -}}
{{- end -}}

{{- define "infera.etcdName" -}}
{{- printf "%s-etcd" (include "infera.fullname" .) -}}
{{- end -}}

{{- define "infera.natsName" -}}
{{- printf "%s-nats" (include "infera.fullname" .) -}}
{{- end -}}

{{/* http or https: the chart's etcd's scheme. */}}
{{- define "infera.etcdScheme" -}}
{{- ternary "https" "http" .Values.etcd.tls.enabled -}}
{{- end -}}

{{/* The Secret with etcd's own certificate (generated unless named). */}}
{{- define "infera.etcdServerSecret" -}}
{{- .Values.etcd.tls.serverSecretName | default (printf "%s-server-tls" (include "infera.etcdName" .)) -}}
{{- end -}}

{{/* The Secret with etcd's clients' certificate (generated unless named). */}}
{{- define "infera.etcdClientSecret" -}}
{{- .Values.etcd.tls.clientSecretName | default (printf "%s-client-tls" (include "infera.etcdName" .)) -}}
{{- end -}}

{{/* Client URLs of the chart's etcd members. */}}
{{- define "infera.etcdEndpoints" -}}
{{- $name := include "infera.etcdName" . -}}
{{- $ns := .Release.Namespace -}}
{{- $scheme := include "infera.etcdScheme" . -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $urls = append $urls (printf "%s://%s-%d.%s-peers.%s.svc:2379" $scheme $name $i $name $ns) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}
