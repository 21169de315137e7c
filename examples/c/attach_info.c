/* attach_info: attaches to framelinkd as a producer, prints what the daemon granted and detaches.
 *
 *   framelink_attach_info [STREAM [SOCKET]]
 *
 * STREAM defaults to "example"; SOCKET to $FRAMELINK_SOCKET, else /run/framelink/framelinkd.sock.
 * Exit status: 0 attached, 1 bad arguments, 2 the daemon could not be reached or refused. */
#include <framelink/framelink.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  if (argc > 3 || (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0))) {
    fprintf(stderr, "usage: %s [STREAM [SOCKET]]\n", argv[0]);
    return 1;
  }
  fl_client_options options;
  fl_client_options_init(&options);
  options.role = FL_PRODUCER;
  options.stream = argc > 1 ? argv[1] : "example";
  options.socket_path = argc > 2 ? argv[2] : NULL;
  options.client_name = "framelink_attach_info";
  options.slot_count = 2;
  options.slot_size = 64 * 1024;
  options.attach_timeout_ms = 2000;

  printf("libframelink %s\n", fl_version());
  fl_client* client = NULL;
  if (fl_attach(&options, &client) != FL_OK) {
    fprintf(stderr, "framelink_attach_info: %s\n", fl_last_error());
    return 2;
  }
  fl_client_info info;
  if (fl_client_get_info(client, &info) != FL_OK) {
    fprintf(stderr, "framelink_attach_info: %s\n", fl_last_error());
    fl_detach(client);
    return 2;
  }
  printf("attached to framelinkd pid %llu as producer of '%s': client %llu, %u slots of %llu bytes\n",
         (unsigned long long)info.daemon_pid, options.stream, (unsigned long long)info.client_id,
         info.slot_count, (unsigned long long)info.slot_size);
  fl_detach(client);
  return 0;
}
