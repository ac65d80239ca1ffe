/* rarpwatch IFACE SECONDS: print "RARP <sender MAC>" for each RARP frame
 * that arrives on IFACE (a tap: what its owner writes to it), for SECONDS.
 * For scripts/lab/linux-migrate.sh, which checks that a migrated VM's
 * destination announces the guest's MAC. Built static on the host by
 * linux-migrate.prep.sh. */
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: rarpwatch IFACE SECONDS\n");
        return 2;
    }
    int s = socket(AF_PACKET, SOCK_RAW, htons(0x8035));
    struct sockaddr_ll a = { .sll_family = AF_PACKET, .sll_protocol = htons(0x8035) };
    a.sll_ifindex = if_nametoindex(argv[1]);
    if (s < 0 || a.sll_ifindex == 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("rarpwatch");
        return 1;
    }
    alarm(atoi(argv[2]));
    unsigned char b[2048];
    for (;;) {
        ssize_t n = recv(s, b, sizeof b, 0);
        if (n < 42)
            continue;
        /* Opcode 3: a reverse request, as announcements are. */
        if (b[20] == 0 && b[21] == 3) {
            printf("RARP %02x:%02x:%02x:%02x:%02x:%02x\n", b[6], b[7], b[8], b[9], b[10], b[11]);
            fflush(stdout);
        }
    }
}
