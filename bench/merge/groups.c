/* The floor of an add written a group of batches at a time, with bare system calls:
 * each batch of new pages pwritten into its own memfd by its own thread, then every
 * batch of the group (or of the group before, `lag` 1, as advm does) mapped over its
 * source. What a second copying thread can gain on this machine; docs/merge.md quotes it.
 * Build and run: cc -O2 -pthread -o groups bench/merge/groups.c && ./groups MIB BATCH_MIB THREADS LAG */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static char*a; static size_t batch;
struct job{size_t off;int fd;};
static void*wr(void*p){struct job*j=p; j->fd=memfd_create("b",MFD_ALLOW_SEALING);
  for(size_t d=0;d<batch;){ssize_t r=pwrite(j->fd,a+j->off+d,batch-d,d); if(r<=0){perror("pwrite");exit(1);} d+=r;} return 0;}
int main(int argc,char**argv){
  if(argc<5||atoi(argv[3])<1||atoi(argv[3])>8){fprintf(stderr,"usage: groups MIB BATCH_MIB THREADS(1-8) LAG(0|1)\n");return 2;}
  size_t len=(size_t)atoi(argv[1])<<20; batch=(size_t)atoi(argv[2])<<20; int nt=atoi(argv[3]), lag=atoi(argv[4]);
  a=mmap(0,len,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  uint64_t x=88172645463325252ull;
  for(size_t i=0;i<len;i+=8){x^=x<<13;x^=x>>7;x^=x<<17;*(uint64_t*)(a+i)=x;}
  size_t n=len/batch; struct job*J=calloc(n,sizeof *J);
  double t0=now();
  for(size_t g=0; g*nt < n + lag*nt; g++){
    pthread_t t[8]; int k=0;
    for(size_t b=g*nt; b<(g+1)*nt && b<n; b++,k++){J[b].off=b*batch; if(k==0) continue; pthread_create(&t[k],0,wr,&J[b]);}
    if(g*nt<n) wr(&J[g*nt]);
    for(int i=1;i<k;i++) pthread_join(t[i],0);
    if(g>=(size_t)lag) for(size_t b=(g-lag)*nt; b<(g-lag+1)*nt && b<n; b++){ if(mmap(a+b*batch,batch,PROT_READ,MAP_PRIVATE|MAP_FIXED,J[b].fd,0)==MAP_FAILED){perror("mmap");return 1;} close(J[b].fd);}
  }
  printf("batch %zu threads %d lag %d: %.2f GB/s\n",batch>>20,nt,lag,len/(now()-t0)/1e9); return 0;}
